package testkit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestProcess(t *testing.T) {
	log := filepath.Join(t.TempDir(), "sh.log")
	// The shell prints, then sleeps until signalled.
	p := StartProcess(t, ProcessConfig{Bin: "/bin/sh", LogPath: log, Args: []string{"-c", "echo started $$; exec sleep 60"}})
	if !p.Running() {
		t.Fatal("not running after start")
	}
	waitLog := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for strings.Count(string(p.LogTail(1<<10)), "started") < want {
			if time.Now().After(deadline) {
				t.Fatalf("log %q never had %d starts", p.LogTail(1<<10), want)
			}
			time.Sleep(10 * time.Millisecond) // polling a file someone else writes
		}
	}
	waitLog(1)
	if rss, err := p.PeakRSS(); err != nil || rss <= 0 {
		t.Errorf("PeakRSS() = %d, %v; want a positive size", rss, err)
	}
	p.Kill()
	if p.Running() {
		t.Fatal("running after Kill")
	}
	select {
	case <-p.Exited():
	default:
		t.Fatal("Exited not closed after Kill")
	}

	// A restart appends to the same log.
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	waitLog(2)
	if err := p.Terminate(10 * time.Second); err != nil {
		t.Errorf("Terminate: %v; sleep exits on SIGTERM", err)
	}
	if p.Running() {
		t.Fatal("running after Terminate")
	}
}

func TestTerminateKillsAfterGrace(t *testing.T) {
	// The shell ignores SIGTERM, so only the kill ends it.
	p := StartProcess(t, ProcessConfig{Bin: "/bin/sh", Args: []string{"-c", "trap '' TERM; echo ready; while :; do sleep 1; done"}})
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(string(p.LogTail(100)), "ready") {
		if time.Now().After(deadline) {
			t.Fatal("the shell never started")
		}
		time.Sleep(10 * time.Millisecond) // polling a file someone else writes
	}
	if err := p.Terminate(100 * time.Millisecond); err == nil {
		t.Fatal("Terminate reported a clean exit from a process that ignores SIGTERM")
	}
	if p.Running() {
		t.Fatal("running after Terminate's kill")
	}
}

func TestTail(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"one\ntwo\nthree\n", 8, "three\n"}, // from a line start
		{"abcdefgh", 4, "efgh"},             // no line start: the bytes
	} {
		if got := string(Tail([]byte(tc.in), tc.n)); got != tc.want {
			t.Errorf("Tail(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestModuleRoot(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "cmd", "cached-apiserver")); err != nil {
		t.Errorf("moduleRoot() = %s, which has no cmd/cached-apiserver: %v", root, err)
	}
}

func TestPauseResume(t *testing.T) {
	p := StartProcess(t, ProcessConfig{Bin: "/bin/sh", Args: []string{"-c", "exec sleep 60"}})
	t.Cleanup(func() { _ = p.Resume() })
	waitState := func(paused bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for p.Paused() != paused {
			if time.Now().After(deadline) {
				t.Fatalf("Paused() = %v for 10s, want %v", !paused, paused)
			}
			time.Sleep(10 * time.Millisecond) // polling the kernel's view of the process
		}
	}
	if p.Paused() {
		t.Fatal("paused right after start")
	}
	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	waitState(true)
	if !p.Running() {
		t.Fatal("a paused process is not running")
	}
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	waitState(false)

	// A paused process is still killed, and pausing or resuming one that
	// has exited does nothing.
	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	waitState(true)
	p.Kill()
	if p.Running() {
		t.Fatal("running after Kill of a paused process")
	}
	if err := p.Pause(); err != nil {
		t.Errorf("Pause after exit: %v", err)
	}
	if err := p.Resume(); err != nil {
		t.Errorf("Resume after exit: %v", err)
	}
}
