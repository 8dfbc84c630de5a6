// Package loopbacketcd starts a throwaway single-member etcd on 127.0.0.1
// for the benchmarks: no fsync, error-level logs. The server itself
// configures its embedded etcd in pkg/cmd/server, with durable settings.
package loopbacketcd

import (
	"fmt"
	"net"
	"net/url"
	"strconv"

	"go.etcd.io/etcd/server/v3/embed"
)

// Start runs etcd with its data in dir and waits until it serves. A port of
// 0 picks a free one. It returns the running etcd and its client URL.
func Start(dir string, clientPort, peerPort int) (*embed.Etcd, string, error) {
	ports := []*int{&clientPort, &peerPort}
	for _, p := range ports {
		if *p != 0 {
			continue
		}
		free, err := FreePort()
		if err != nil {
			return nil, "", err
		}
		*p = free
	}
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.LogLevel = "error"
	cfg.UnsafeNoFsync = true // throwaway data
	client := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(clientPort))}
	peer := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(peerPort))}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("starting etcd in %s: %w", dir, err)
	}
	<-e.Server.ReadyNotify()
	return e, client.String(), nil
}

// FreePort returns a loopback port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
