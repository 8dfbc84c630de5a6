package testkit

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"testing"
)

// GzipMembers returns the members of a gzip stream, each decompressed, and
// fails tb if body is not one.
func GzipMembers(tb testing.TB, body []byte) [][]byte {
	tb.Helper()
	ms, err := gzipMembers(body)
	if err != nil {
		tb.Fatal(err)
	}
	return ms
}

func gzipMembers(body []byte) ([][]byte, error) {
	var out [][]byte
	br := bytes.NewReader(body)
	r, err := gzip.NewReader(br)
	for ; err == nil; err = r.Reset(br) {
		r.Multistream(false)
		m, err := io.ReadAll(r)
		if err != nil {
			return out, fmt.Errorf("member %d: %w", len(out), err)
		}
		out = append(out, m)
	}
	if !errors.Is(err, io.EOF) {
		return out, fmt.Errorf("after %d members: %w", len(out), err)
	}
	return out, nil
}
