package testkit

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// EnvInt is the positive integer the environment variable name holds, or
// def when it is unset, not a number or not positive: the sizes and round
// counts the benchmarks take from the environment.
func EnvInt(name string, def int) int {
	if v, err := strconv.Atoi(strings.TrimSpace(os.Getenv(name))); err == nil && v > 0 {
		return v
	}
	return def
}

// Streams is the shape of a benchmark of single-object watch streams
// (make bench-serve, bench-serve-aggregated).
type Streams struct {
	// Count streams, PerConn to a client connection; Writes creates at
	// Rate a second, each on a name of its own, deliver one event to every
	// stream; Idle is how long idle CPU is measured.
	Count, PerConn, Writes int
	Rate                   float64
	Idle                   time.Duration
}

// StreamsFromEnv is def with what SERVE_STREAMS, SERVE_PER_CONN,
// SERVE_WRITES, SERVE_RATE and SERVE_IDLE_SECONDS set. Writes is at most
// Count.
func StreamsFromEnv(def Streams) Streams {
	s := Streams{
		Count:   EnvInt("SERVE_STREAMS", def.Count),
		PerConn: EnvInt("SERVE_PER_CONN", def.PerConn),
		Writes:  EnvInt("SERVE_WRITES", def.Writes),
		Rate:    float64(EnvInt("SERVE_RATE", int(def.Rate))),
		Idle:    time.Duration(EnvInt("SERVE_IDLE_SECONDS", int(def.Idle.Seconds()))) * time.Second,
	}
	s.Writes = min(s.Writes, s.Count)
	return s
}
