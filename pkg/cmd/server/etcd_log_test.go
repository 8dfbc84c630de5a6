package server

import (
	"net/http"
	"sync/atomic"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestStopFilter(t *testing.T) {
	for _, tc := range []struct {
		name     string
		stopping bool
		msg      string
		want     bool // logged
	}{
		{name: "a listener failing while etcd runs is a real error", msg: etcdServeFailed, want: true},
		{name: "listeners closing on Close are not", stopping: true, msg: etcdServeFailed, want: false},
		{name: "other errors while stopping still pass", stopping: true, msg: "failed to purge snapshot file", want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			observed, logs := observer.New(zapcore.InfoLevel)
			stopping := &atomic.Bool{}
			stopping.Store(tc.stopping)
			lg := zap.New(stopFilter{Core: observed, stopping: stopping}).With(zap.String("member", "m"))
			lg.Error(tc.msg, zap.Error(http.ErrServerClosed))
			if got := logs.Len() == 1; got != tc.want {
				t.Fatalf("logged = %v, want %v (%v)", got, tc.want, logs.All())
			}
		})
	}
}

func TestEtcdLoggerHonoursLevel(t *testing.T) {
	lg, err := etcdLogger("error", &atomic.Bool{})
	if err != nil {
		t.Fatal(err)
	}
	if lg.Core().Enabled(zapcore.WarnLevel) || !lg.Core().Enabled(zapcore.ErrorLevel) {
		t.Fatal("an error-level etcd logger should log errors and nothing below")
	}
}
