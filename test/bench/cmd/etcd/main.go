// Command etcd runs an etcd server on loopback for the HTTP benchmark, so
// that etcd's CPU and memory are not counted as the API server's.
package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	dir := flag.String("data-dir", "", "data directory (required)")
	clientPort := flag.Int("client-port", 0, "client port on 127.0.0.1 (required)")
	peerPort := flag.Int("peer-port", 0, "peer port on 127.0.0.1 (required)")
	flag.Parse()
	cfg := embed.NewConfig()
	cfg.Dir = *dir
	cfg.LogLevel = "error"
	cfg.UnsafeNoFsync = true // a benchmark's throwaway data
	client := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", *clientPort)}
	peer := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", *peerPort)}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	<-e.Server.ReadyNotify()
	fmt.Println("ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	e.Close()
}
