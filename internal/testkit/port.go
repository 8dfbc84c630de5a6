package testkit

import (
	"net"
	"testing"

	"github.com/cached-apiserver/cached-apiserver/internal/embedetcd"
)

// FreePort returns a loopback port that was free a moment ago, for a
// process that must be told its port.
func FreePort(tb testing.TB) int {
	tb.Helper()
	port, err := embedetcd.FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	return port
}

// serveLoopback listens on a free loopback port and hands every connection
// to handle, in a goroutine of its own, until the listener closes.
func serveLoopback(handle func(net.Conn)) (net.Listener, error) {
	return serveOn("127.0.0.1:0", handle)
}

// serveOn is serveLoopback on addr.
func serveOn(addr string, handle func(net.Conn)) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(in)
		}
	}()
	return ln, nil
}
