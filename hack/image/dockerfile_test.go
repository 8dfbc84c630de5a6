package main

import (
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestDockerfile reads the project's Dockerfile and builds the image it
// describes from a context of stand-in files: the image must hold exactly
// what the Dockerfile copies, with its user and entrypoint, so that docker
// build and make image cannot differ. An instruction make image cannot
// follow exactly is refused.
func TestDockerfile(t *testing.T) {
	f, err := os.Open("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	d, err := parseDockerfile(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if d.user != "65532:65532" || !slices.Equal(d.entry, []string{"/cached-apiserver"}) {
		t.Errorf("the Dockerfile's user %q and entrypoint %v, want 65532:65532 and [/cached-apiserver]: the Deployment runs as 65532", d.user, d.entry)
	}
	var srcs []string
	for _, c := range d.copies {
		srcs = append(srcs, c.src)
	}
	if !slices.Contains(srcs, "bin/cached-apiserver") {
		t.Errorf("the Dockerfile copies %v: it must copy the binary make build writes, bin/cached-apiserver", srcs)
	}
	context := t.TempDir()
	for _, c := range d.copies {
		p := filepath.Join(context, filepath.FromSlash(c.src))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("content of "+c.src), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	img, err := buildImage(d, context)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Config.User != d.user || !slices.Equal(cfg.Config.Entrypoint, d.entry) {
		t.Errorf("the image's user %q and entrypoint %v, the Dockerfile's %q and %v", cfg.Config.User, cfg.Config.Entrypoint, d.user, d.entry)
	}
	files, _, err := extract(img, "")
	if err != nil {
		t.Fatal(err)
	}
	var got, want []string
	for _, f := range files {
		got = append(got, f.Path)
	}
	for _, c := range d.copies {
		want = append(want, c.dst)
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("the image holds %v, the Dockerfile copies to %v", got, want)
	}
	// The same files make the same image.
	again, err := buildImage(d, context)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := digest(t, img), digest(t, again); a != b {
		t.Errorf("two builds of the same files: %s and %s", a, b)
	}
}

func TestParseDockerfileRefuses(t *testing.T) {
	for _, tc := range []struct{ name, file string }{
		{"another base", "FROM debian\nCOPY a /a\nUSER 1\nENTRYPOINT [\"/a\"]\n"},
		{"RUN", "FROM scratch\nRUN true\nCOPY a /a\nUSER 1\nENTRYPOINT [\"/a\"]\n"},
		{"COPY --from", "FROM scratch\nCOPY --from=build /a /a\nUSER 1\nENTRYPOINT [\"/a\"]\n"},
		{"shell form", "FROM scratch\nCOPY a /a\nUSER 1\nENTRYPOINT /a\n"},
		{"no user", "FROM scratch\nCOPY a /a\nENTRYPOINT [\"/a\"]\n"},
		{"several files to a file", "FROM scratch\nCOPY a b /c\nUSER 1\nENTRYPOINT [\"/a\"]\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := parseDockerfile(strings.NewReader(tc.file)); err == nil {
				t.Errorf("parsed %q", tc.file)
			}
		})
	}
}

func digest(t *testing.T, img v1.Image) string {
	t.Helper()
	h, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return h.String()
}
