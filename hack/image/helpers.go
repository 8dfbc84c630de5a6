package main

import (
	"io"
	"log"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// parseTag reads an image reference with a tag, as docker tags an image.
func parseTag(s string) (name.Tag, error) { return name.NewTag(s) }

// writeTarball writes img, tagged ref, as docker save writes an image.
func writeTarball(path string, ref name.Tag, img v1.Image) error {
	return tarball.WriteToFile(path, ref, img)
}

// nopLogger is the in-process registry's logger: its requests are not news.
func nopLogger() *log.Logger { return log.New(io.Discard, "", 0) }
