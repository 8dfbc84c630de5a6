// Package testkit is what every test harness shares: child processes that
// die with their test and print their log's tail when it fails, etcd on
// 127.0.0.1 as one to three member processes, a TCP proxy that
// injects network faults, a round-robin balancer, free ports, and binaries
// built once per test process.
//
// Tests start real processes and kill only those, by PID.
package testkit
