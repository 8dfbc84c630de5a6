package faults

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// process is a child process the harness started. The harness signals
// only processes it started, by their PID, and kills whatever still runs
// when the test ends.
type process struct {
	name    string
	bin     string
	args    []string
	env     []string
	logPath string

	cmd *exec.Cmd
	// exited is closed when the current run has exited.
	exited chan struct{}
}

// startProcess runs bin with args, its output appended to logPath.
func startProcess(tb testing.TB, name, logPath, bin string, env []string, args ...string) *process {
	tb.Helper()
	p := &process{name: name, bin: bin, args: args, env: env, logPath: logPath}
	if err := p.start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.kill() })
	return p
}

// start runs the process again after it exited.
func (p *process) start() error {
	log, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(exited)
	}()
	p.cmd, p.exited = cmd, exited
	return nil
}

// running reports whether the current run has not exited.
func (p *process) running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// kill sends SIGKILL and waits for the exit.
func (p *process) kill() {
	if !p.running() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// terminate sends SIGTERM and waits up to grace for a clean exit, then kills.
func (p *process) terminate(grace time.Duration) error {
	if !p.running() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(grace):
		p.kill()
		return fmt.Errorf("%s did not exit within %v of SIGTERM", p.name, grace)
	}
}

// peakRSS returns the peak resident set of p's current run (VmHWM).
func peakRSS(p *process) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in %s's status", p.name)
}
