package testkit

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// Target is a program of this module to build.
type Target struct {
	// Name is the binary's file name.
	Name string
	// Package is its package path relative to the module's root, e.g. "./cmd/cached-apiserver".
	Package string
	// Tags are build tags, comma-separated.
	Tags string
}

// Common targets.
var (
	Etcd     = Target{Name: "etcd", Package: "./test/cmd/etcd"}
	Ours     = Target{Name: "ours", Package: "./cmd/cached-apiserver"}
	Upstream = Target{Name: "upstream", Package: "./test/bench/cmd/server-upstream"}
)

// builds is every binary this test process has built, in one directory
// that RemoveBuilds deletes.
var builds struct {
	// mu guards everything below; held while building, so that a target is
	// built once however many tests ask.
	mu    sync.Mutex
	dir   string
	paths map[Target]string
	// tools holds each hack/ script BuildTool ran, and its error.
	tools map[string]error
}

// Build compiles each target once per test process and returns their
// paths, in the order asked.
func Build(tb testing.TB, targets ...Target) []string {
	tb.Helper()
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.dir == "" {
		dir, err := os.MkdirTemp("", "cached-apiserver-bin")
		if err != nil {
			tb.Fatal(err)
		}
		builds.dir, builds.paths = dir, map[Target]string{}
	}
	root, err := moduleRoot()
	if err != nil {
		tb.Fatal(err)
	}
	paths := make([]string, len(targets))
	for i, t := range targets {
		if p, ok := builds.paths[t]; ok {
			paths[i] = p
			continue
		}
		out := filepath.Join(builds.dir, t.Name)
		cmd := exec.Command("go", "build", "-tags", t.Tags, "-o", out, t.Package)
		cmd.Dir = root
		if msg, err := cmd.CombinedOutput(); err != nil {
			tb.Fatalf("building %s: %v\n%s", t.Package, err, msg)
		}
		builds.paths[t], paths[i] = out, out
	}
	return paths
}

// BuildTool runs the module's hack/<script> once per test process and
// returns bin/<name>: the tools with modules of their own (kube-apiserver,
// kubectl), which their scripts build there, reusing a binary that is up
// to date (make test builds them before the tests). A tool that cannot be
// built fails the test; it is never skipped.
func BuildTool(tb testing.TB, script, name string) string {
	tb.Helper()
	root, err := moduleRoot()
	if err != nil {
		tb.Fatal(err)
	}
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.tools == nil {
		builds.tools = map[string]error{}
	}
	err, ran := builds.tools[script]
	if !ran {
		if out, runErr := exec.Command(filepath.Join(root, "hack", script)).CombinedOutput(); runErr != nil {
			err = fmt.Errorf("hack/%s: %v\n%s", script, runErr, out)
		}
		builds.tools[script] = err
	}
	if err != nil {
		tb.Fatal(err)
	}
	return filepath.Join(root, "bin", name)
}

// RemoveBuilds deletes what Build made (a few hundred MB); TestMain calls
// it after the tests.
func RemoveBuilds() {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.dir != "" {
		_ = os.RemoveAll(builds.dir)
		builds.dir, builds.paths = "", nil
	}
}

// moduleRoot is the directory of this module's go.mod, above the test's
// working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(mod, []byte("module github.com/cached-apiserver/cached-apiserver\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of github.com/cached-apiserver/cached-apiserver above the working directory")
		}
		dir = parent
	}
}
