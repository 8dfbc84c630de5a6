package testkit

import (
	"io"
	"os"
	"os/exec"
	"testing"
)

// Child is this test binary run again as a child process, which tells what
// to do from its environment (a TestMain that checks it first), and exits
// when its standard input closes.
type Child struct {
	Cmd    *exec.Cmd
	Stdin  io.WriteCloser
	Stdout io.ReadCloser
}

// StartChild starts this test binary with env added to its environment,
// its standard error to stderr, and no test to run.
func StartChild(tb testing.TB, stderr io.Writer, env ...string) *Child {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	return &Child{Cmd: cmd, Stdin: stdin, Stdout: stdout}
}
