package object

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
	"unsafe"
)

// scan is the input and where decodeExact is in it.
type scan struct {
	b []byte
	i int
	// share makes strings of the input's bytes (decodeExact).
	share bool
}

func (s *scan) fail(what string) error { return fmt.Errorf("at byte %d: %s", s.i, what) }

// next is the byte s is at, or 0 at the end.
func (s *scan) next() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// eat moves past c, which s must be at.
func (s *scan) eat(c byte) error {
	if s.next() != c {
		return s.fail(fmt.Sprintf("want %q", c))
	}
	s.i++
	return nil
}

// null moves past a null, if s is at one.
func (s *scan) null() bool {
	if bytes.HasPrefix(s.b[s.i:], []byte("null")) {
		s.i += 4
		return true
	}
	return false
}

// literal returns the number, true, false or null s is at, and moves past
// it.
func (s *scan) literal() []byte {
	start := s.i
	for ; s.i < len(s.b); s.i++ {
		switch s.b[s.i] {
		case ',', '}', ']':
			return s.b[start:s.i]
		}
	}
	return s.b[start:]
}

// rawString returns the bytes of the string s is at, between its quotes,
// if it has no escape, and moves past it; escaped is true if it has one.
func (s *scan) rawString() (raw []byte, escaped bool, err error) {
	if s.next() != '"' {
		return nil, false, s.fail("want a string")
	}
	rest := s.b[s.i+1:]
	n := bytes.IndexByte(rest, '"')
	if n < 0 {
		return nil, false, s.fail("a string cut short")
	}
	if bytes.IndexByte(rest[:n], '\\') >= 0 {
		return nil, true, nil
	}
	s.i += n + 2
	return rest[:n], false, nil
}

// str returns the string s is at, a copy, and moves past it. One with an
// escape, which the encoder writes for quotes, backslashes, control
// characters and <, >, &, is decoded by encoding/json.
func (s *scan) str() (string, error) {
	raw, escaped, err := s.rawString()
	switch {
	case err != nil:
		return "", err
	case escaped:
		var out string
		err := json.Unmarshal(s.value(), &out)
		return out, err
	case len(raw) == 0:
		return "", nil
	case s.share:
		return unsafe.String(&raw[0], len(raw)), nil
	case hasControl(raw) || !utf8.Valid(raw):
		// encoding/json rejects the first and replaces the second.
		return "", s.fail("a string the encoder does not write")
	}
	return string(raw), nil
}

// value returns the JSON value s is at, and moves past it. It finds the
// value's end, and leaves checking the value to its reader.
func (s *scan) value() []byte {
	start := s.i
	switch s.next() {
	case '"':
		s.skipString()
	case '{', '[':
		for depth := 0; s.i < len(s.b); {
			switch s.b[s.i] {
			case '"':
				s.skipString()
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			s.i++
			if depth == 0 {
				break
			}
		}
	default:
		if !strings.ContainsRune("-0123456789tfn", rune(s.next())) {
			return nil // whitespace, or not JSON
		}
		s.literal()
	}
	return s.b[start:s.i]
}

// skipString moves past the string s is at, escapes and all.
func (s *scan) skipString() {
	for s.i++; s.i < len(s.b) && s.b[s.i] != '"'; s.i++ {
		if s.b[s.i] == '\\' {
			s.i++
		}
	}
	s.i = min(s.i+1, len(s.b))
}

// entries reads the object s is at, to its end: for each key, it calls
// value with the key once s is past it and its colon, at its value, which
// value must read.
func (s *scan) entries(value func(key []byte) error) error {
	if err := s.eat('{'); err != nil {
		return err
	}
	for first := true; ; first = false {
		if s.next() == '}' {
			s.i++
			return nil
		}
		if !first {
			if err := s.eat(','); err != nil {
				return err
			}
		}
		key, err := s.key()
		if err == nil {
			err = s.eat(':')
		}
		if err == nil {
			err = value(key)
		}
		if err != nil {
			return err
		}
	}
}

// key returns the key s is at, and moves past it: its bytes where they
// lie, without a copy, unless it holds an escape.
func (s *scan) key() ([]byte, error) {
	raw, escaped, err := s.rawString()
	switch {
	case err != nil:
		return nil, err
	case escaped:
		str, err := s.str()
		return []byte(str), err
	case hasControl(raw) || !utf8.Valid(raw):
		return nil, s.fail("a key the encoder does not write")
	}
	return raw, nil
}

// keyString is key as a map's key: the input's bytes, with share.
func (s *scan) keyString(key []byte) string {
	if s.share && len(key) > 0 {
		return unsafe.String(&key[0], len(key))
	}
	return string(key)
}

// hasControl reports whether b holds a byte below 0x20, eight bytes at a
// time. Taking 0x20 from every byte sets the top bit of each byte below
// 0x20, and masking with the word's complement drops the bytes whose own
// top bit was set. A borrow can set a bit only above a byte below 0x20,
// so a bit is left exactly when there is one.
func hasControl(b []byte) bool {
	const ones, highs = 0x2020202020202020, 0x8080808080808080
	for len(b) >= 8 {
		x := binary.LittleEndian.Uint64(b)
		if (x-ones)&^x&highs != 0 {
			return true
		}
		b = b[8:]
	}
	for _, c := range b {
		if c < 0x20 {
			return true
		}
	}
	return false
}
