package testkit

import (
	"os"
	"strconv"
	"strings"
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
