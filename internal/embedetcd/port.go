package embedetcd

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// lowestPort is the bottom of the range FreePort picks from: above the
// ports well-known services tend to use.
const lowestPort = 15000

// handedOut are the ports FreePort has returned in this process, so that it
// never returns one twice even after its user has closed it.
var handedOut = struct {
	sync.Mutex // guards ports
	ports      map[int]bool
}{ports: map[int]bool{}}

// FreePort returns a loopback port that is free now, for a process that
// must be told its port before it binds it.
//
// It picks below the kernel's ephemeral range. A port from the ephemeral
// range (what listening on port 0 gives) can be taken, between this call
// and the bind, by any outgoing connection or any other listener on port
// 0: CI lost an etcd member to "address already in use" that way. Below the
// range only another caller of FreePort competes, and it picks at random
// from about 17,000 ports.
func FreePort() (int, error) {
	top := ephemeralLow()
	if top-lowestPort < 1000 {
		return anyFreePort()
	}
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 100 {
		port := lowestPort + rand.IntN(top-lowestPort)
		if handedOut.ports[port] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		if err := l.Close(); err != nil {
			return 0, err
		}
		handedOut.ports[port] = true
		return port, nil
	}
	return 0, fmt.Errorf("no free loopback port in [%d, %d) after 100 tries", lowestPort, top)
}

// ephemeralLow is the bottom of the kernel's ephemeral port range: Linux's
// setting, or its default where there is none to read.
func ephemeralLow() int {
	const linuxDefault = 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return linuxDefault
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return linuxDefault
	}
	low, err := strconv.Atoi(fields[0])
	if err != nil {
		return linuxDefault
	}
	return low
}

// anyFreePort is a port the kernel picks, for machines whose ephemeral
// range leaves too little room below it.
func anyFreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
