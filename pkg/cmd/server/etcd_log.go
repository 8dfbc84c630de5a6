package server

import (
	"fmt"
	"sync/atomic"

	"go.etcd.io/etcd/client/pkg/v3/logutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// etcdServeFailed is what embedded etcd logs, at error level, when one of
// its listeners stops serving, which Close makes every listener do.
const etcdServeFailed = "setting up serving from embedded etcd failed."

// stopFilter drops etcdServeFailed once stopping is set, so that an orderly
// shutdown does not print errors. Before that, the entry is a real failure
// and passes.
type stopFilter struct {
	zapcore.Core
	stopping *atomic.Bool
}

func (f stopFilter) With(fields []zapcore.Field) zapcore.Core {
	return stopFilter{Core: f.Core.With(fields), stopping: f.stopping}
}

func (f stopFilter) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if e.Message == etcdServeFailed && f.stopping.Load() {
		return ce
	}
	return f.Core.Check(e, ce)
}

// etcdLogger is the logger embedded etcd builds for itself (JSON on stderr
// at level), with stopFilter around it.
func etcdLogger(level string, stopping *atomic.Bool) (*zap.Logger, error) {
	lvl, err := parseEtcdLogLevel(level)
	if err != nil {
		return nil, err
	}
	cfg := logutil.DefaultZapLoggerConfig
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	return cfg.Build(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return stopFilter{Core: c, stopping: stopping}
	}))
}

// parseEtcdLogLevel parses --embedded-etcd-log-level. etcd's own parser
// panics on a bad level; this one says what is allowed.
func parseEtcdLogLevel(level string) (zapcore.Level, error) {
	var l zapcore.Level
	if err := l.Set(level); err != nil {
		return l, fmt.Errorf("--embedded-etcd-log-level must be debug, info, warn or error, not %q", level)
	}
	return l, nil
}
