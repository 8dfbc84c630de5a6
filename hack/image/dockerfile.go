package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"path"
	"strings"
)

// dockerfile is what the project's Dockerfile says of the image: the files
// it copies, where, and the user and entrypoint. The image is built from it
// with a container engine (docker build) or without one (make image), so
// that both put the same files, user and entrypoint in the image.
type dockerfile struct {
	// copies are the files, in order: a path in the build context to a
	// path in the image.
	copies []copyFile
	user   string
	entry  []string
}

// copyFile is one file a COPY puts in the image.
type copyFile struct {
	src, dst string
}

// parseDockerfile reads the subset of Dockerfile syntax the image needs, and
// refuses anything else, so that the two ways of building it cannot drift:
// FROM scratch; COPY of files, to a file or to a directory ending in "/";
// USER; ENTRYPOINT in exec form; comments and blank lines.
func parseDockerfile(r io.Reader) (*dockerfile, error) {
	d := &dockerfile{}
	sc := bufio.NewScanner(r)
	from := false
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		instr, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(instr) {
		case "FROM":
			if rest != "scratch" || from {
				return nil, fmt.Errorf("line %d: %q: only one FROM scratch is supported: the image holds nothing but what it copies", n, line)
			}
			from = true
		case "COPY":
			args := strings.Fields(rest)
			if len(args) < 2 || strings.HasPrefix(args[0], "--") {
				return nil, fmt.Errorf("line %d: %q: only COPY <file>... <destination> is supported", n, line)
			}
			srcs, dst := args[:len(args)-1], args[len(args)-1]
			if len(srcs) > 1 && !strings.HasSuffix(dst, "/") {
				return nil, fmt.Errorf("line %d: %q: several files go to a directory ending in /", n, line)
			}
			for _, src := range srcs {
				to := dst
				if strings.HasSuffix(dst, "/") {
					to = path.Join(dst, path.Base(src))
				}
				d.copies = append(d.copies, copyFile{src: src, dst: path.Clean("/" + to)})
			}
		case "USER":
			d.user = rest
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &d.entry); err != nil || len(d.entry) == 0 {
				return nil, fmt.Errorf("line %d: %q: only ENTRYPOINT in exec form is supported", n, line)
			}
		default:
			return nil, fmt.Errorf("line %d: %q: %s is not supported by make image", n, line, instr)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if !from || len(d.copies) == 0 || d.user == "" || len(d.entry) == 0 {
		return nil, fmt.Errorf("the Dockerfile must have FROM scratch, COPY, USER and ENTRYPOINT")
	}
	return d, nil
}
