// Command etcd runs an etcd server on loopback for the HTTP benchmark, so
// that etcd's CPU and memory are not counted as the API server's.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/cached-apiserver/cached-apiserver/internal/loopbacketcd"
)

func main() {
	dir := flag.String("data-dir", "", "data directory (required)")
	clientPort := flag.Int("client-port", 0, "client port on 127.0.0.1 (required)")
	peerPort := flag.Int("peer-port", 0, "peer port on 127.0.0.1 (0 picks one)")
	flag.Parse()
	if *dir == "" || *clientPort == 0 {
		fmt.Fprintln(os.Stderr, "etcd: -data-dir and -client-port are required")
		os.Exit(2)
	}
	e, _, err := loopbacketcd.Start(*dir, *clientPort, *peerPort)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	e.Close()
}
