package main

import (
	"os"
	"strings"
	"testing"

	"github.com/cached-apiserver/cached-apiserver/pkg/version"
)

// TestCommandLine runs the command with arguments that must not start a
// server: help, version and mistakes. A case that started one would block
// and serve; none may.
func TestCommandLine(t *testing.T) {
	for _, tc := range []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout []string
		wantStderr string
	}{
		{name: "--help", args: []string{"--help"}, wantStdout: []string{"Usage:\n  cached-apiserver [flags]",
			"Cached-apiserver flags:", "Watch cache flags:", "Etcd flags:", "Secure serving flags:", "Authentication flags:",
			"--max-watches int", "--watch-cache-history-budget", "Global flags:", "--version"}},
		{name: "-h", args: []string{"-h"}, wantStdout: []string{"Usage:", "Embedded etcd flags:"}},
		{name: "--version", args: []string{"--version"}, wantStdout: []string{"cached-apiserver " + version.Version + "\n"}},
		{name: "unknown flag", args: []string{"--no-such-flag"}, wantCode: 2,
			wantStderr: "cached-apiserver: unknown flag: --no-such-flag (see --help)\n"},
		{name: "bad value", args: []string{"--max-watches=lots"}, wantCode: 2,
			wantStderr: `cached-apiserver: invalid argument "lots" for "--max-watches" flag: strconv.ParseInt: parsing "lots": invalid syntax (see --help)` + "\n"},
		{name: "stray argument", args: []string{"serve"}, wantCode: 2,
			wantStderr: "cached-apiserver: unexpected arguments [\"serve\"]: it takes only flags (see --help)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Chdir(t.TempDir()) // nothing may be created here
			var stdout, stderr strings.Builder
			if code := run(tc.args, &stdout, &stderr); code != tc.wantCode {
				t.Fatalf("exit %d, want %d; stderr: %s", code, tc.wantCode, stderr.String())
			}
			for _, want := range tc.wantStdout {
				if !strings.Contains(stdout.String(), want) {
					t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
				}
			}
			if stderr.String() != tc.wantStderr {
				t.Errorf("stderr = %q, want %q", stderr.String(), tc.wantStderr)
			}
			if entries, _ := os.ReadDir("."); len(entries) > 0 {
				t.Errorf("created %s in the working directory", entries[0].Name())
			}
		})
	}
}
