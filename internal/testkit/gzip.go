package testkit

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"testing"
	"testing/iotest"
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

// GzipReadable returns what a client's gzip reader hands on, before it
// must wait for more, from a stream that has sent body so far: Go's reader
// returns the data a deflate stream holds up to its last flush, and
// withholds what follows until the next block completes.
func GzipReadable(body []byte) []byte {
	r, err := gzip.NewReader(io.MultiReader(bytes.NewReader(body), iotest.ErrReader(errors.New("nothing more sent yet"))))
	if err != nil {
		return nil
	}
	var out []byte
	buf := make([]byte, 4096)
	for {
		n, err := r.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			return out // with an error, the reader was waiting for more
		}
	}
}
