package testkit

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// logTail is how much of a process's log a failed test prints.
const logTail = 8 << 10

// ProcessConfig is a child process to run.
type ProcessConfig struct {
	// Name names the process in messages; the binary's base name when empty.
	Name string
	// Bin and Args are the program and its arguments.
	Bin  string
	Args []string
	// Env is added to the test's environment.
	Env []string
	// LogPath receives stdout and stderr, appended across restarts; a file
	// in the test's temporary directory when empty.
	LogPath string
	// Grace is how long the test's cleanup waits after SIGTERM before it
	// kills; 0 kills at once.
	Grace time.Duration
}

// Process is a child process a test started. It is killed when the test
// ends, and by the kernel if the test binary dies first, and its log's
// tail is printed if the test failed.
//
// A Process is used from the test's goroutine; Running may be called from any.
type Process struct {
	cfg ProcessConfig
	cmd *exec.Cmd
	// exited is closed when the current run has exited.
	exited chan struct{}
}

// StartProcess runs cfg and fails tb if it cannot start.
func StartProcess(tb testing.TB, cfg ProcessConfig) *Process {
	tb.Helper()
	if cfg.Name == "" {
		cfg.Name = filepath.Base(cfg.Bin)
	}
	if cfg.LogPath == "" {
		cfg.LogPath = filepath.Join(tb.TempDir(), cfg.Name+".log")
	}
	p := &Process{cfg: cfg}
	if err := p.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if p.cfg.Grace > 0 {
			_ = p.Terminate(p.cfg.Grace)
		} else {
			p.Kill()
		}
		if tb.Failed() {
			tb.Logf("%s (pid %d) log, last %d KiB:\n%s", p.cfg.Name, p.Pid(), logTail>>10, p.LogTail(logTail))
		}
	})
	return p
}

// Start runs the process again after it exited.
func (p *Process) Start() error {
	log, err := os.OpenFile(p.cfg.LogPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.cfg.Bin, p.cfg.Args...)
	cmd.Env = append(os.Environ(), p.cfg.Env...)
	cmd.Stdout, cmd.Stderr = log, log
	// If the test binary is killed, cleanups do not run: the kernel ends
	// the process instead of leaving it behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("starting %s: %w", p.cfg.Name, err)
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

// Name is the process's name in messages.
func (p *Process) Name() string { return p.cfg.Name }

// LogPath is where its output goes.
func (p *Process) LogPath() string { return p.cfg.LogPath }

// Pid is the current run's process ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited is closed when the current run exits.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Running reports whether the current run has not exited.
func (p *Process) Running() bool {
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

// Kill sends SIGKILL and waits for the exit.
func (p *Process) Kill() {
	if !p.Running() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// Pause stops the current run with SIGSTOP, as a machine that stalls
// does: its sockets stay open and the kernel accepts connections for it,
// but nothing answers until Resume. A test that pauses a process resumes
// it in a cleanup, so that no client of it hangs past the test; Kill ends a
// paused process too.
func (p *Process) Pause() error { return p.signal(syscall.SIGSTOP) }

// Resume continues the current run after Pause with SIGCONT. It does
// nothing to a running process, and returns nil for one that has exited.
func (p *Process) Resume() error { return p.signal(syscall.SIGCONT) }

// Paused reports whether the current run is stopped by a signal, as read
// from its /proc stat.
func (p *Process) Paused() bool {
	if !p.Running() {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid()))
	if err != nil {
		return false
	}
	// The state is the first field after the command's name, which is in
	// parentheses and may hold spaces.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return len(fields) > 0 && fields[0] == "T"
}

// signal sends sig to the current run, unless it has exited.
func (p *Process) signal(sig syscall.Signal) error {
	if !p.Running() {
		return nil
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s: %v: %w", p.cfg.Name, sig, err)
	}
	return nil
}

// Terminate sends SIGTERM and waits up to grace for the exit, then kills.
func (p *Process) Terminate(grace time.Duration) error {
	if !p.Running() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(grace):
		p.Kill()
		return fmt.Errorf("%s did not exit within %v of SIGTERM", p.cfg.Name, grace)
	}
}

// LogTail returns at most the last n bytes of the log, from a line start.
func (p *Process) LogTail(n int) []byte {
	b, err := os.ReadFile(p.cfg.LogPath)
	if err != nil {
		return []byte(err.Error())
	}
	return Tail(b, n)
}

// Tail returns at most the last n bytes of b, from a line start.
func Tail(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	b = b[len(b)-n:]
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	return b
}

// PeakRSS returns the peak resident set of the current run (VmHWM).
func (p *Process) PeakRSS() (int64, error) { return p.status("VmHWM") }

// RSS returns the resident set of the current run (VmRSS).
func (p *Process) RSS() (int64, error) { return p.status("VmRSS") }

// status returns the size field of the current run's /proc status, in bytes.
func (p *Process) status(field string) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in %s's status", field, p.cfg.Name)
}

// CPU returns the CPU time, user and system, the current run has used.
func (p *Process) CPU() (time.Duration, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid()))
	if err != nil {
		return 0, err
	}
	// The fields after the command's name, which is in parentheses and may
	// hold spaces: utime and stime are the 12th and 13th of them.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("%s's stat has %d fields", p.cfg.Name, len(fields))
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	const ticksPerSecond = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticksPerSecond, nil
}
