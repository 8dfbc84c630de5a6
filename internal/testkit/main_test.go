package testkit

import (
	"os"
	"testing"
)

// TestMain removes what Build made.
func TestMain(m *testing.M) {
	code := m.Run()
	RemoveBuilds()
	os.Exit(code)
}
