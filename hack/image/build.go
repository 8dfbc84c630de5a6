package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// buildImage builds the image the Dockerfile describes from the build
// context dir, without a container engine: one layer of the files it
// copies, owned by root, with fixed times, so that the same files make the
// same digest.
func buildImage(d *dockerfile, dir string) (v1.Image, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, c := range d.copies {
		data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(c.src)))
		if err != nil {
			return nil, err
		}
		info, err := os.Stat(filepath.Join(dir, filepath.FromSlash(c.src)))
		if err != nil {
			return nil, err
		}
		// As docker build copies: the file's mode, owned by root.
		hdr := &tar.Header{Name: strings.TrimPrefix(c.dst, "/"), Mode: int64(info.Mode().Perm()), Size: int64(len(data)),
			Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromReader(bytes.NewReader(buf.Bytes()))
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = "amd64", "linux"
	cfg.Config.User = d.user
	cfg.Config.Entrypoint = d.entry
	cfg.Config.WorkingDir = "/"
	return mutate.ConfigFile(img, cfg)
}

// roundTrip pushes img to go-containerregistry's in-process registry as
// repo:tag and pulls it back by digest, as a cluster pulls the reference the
// manifests name: what the registry serves is what it was given.
func roundTrip(img v1.Image, repo, tag string) (v1.Image, name.Digest, error) {
	srv := httptest.NewServer(registry.New(registry.Logger(nopLogger())))
	defer srv.Close()
	ref, err := name.NewTag(strings.TrimPrefix(srv.URL, "http://") + "/" + repo + ":" + tag)
	if err != nil {
		return nil, name.Digest{}, err
	}
	if err := remote.Write(ref, img); err != nil {
		return nil, name.Digest{}, fmt.Errorf("pushing %s: %w", ref, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, name.Digest{}, err
	}
	byDigest := ref.Context().Digest(digest.String())
	pulled, err := remote.Image(byDigest)
	if err != nil {
		return nil, name.Digest{}, fmt.Errorf("pulling %s: %w", byDigest, err)
	}
	got, err := pulled.Digest()
	if err != nil {
		return nil, name.Digest{}, err
	}
	if got != digest {
		return nil, name.Digest{}, fmt.Errorf("pulled %s, pushed %s", got, digest)
	}
	// The layers are read now: the registry goes with this function.
	layers, err := pulled.Layers()
	if err != nil {
		return nil, name.Digest{}, err
	}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return nil, name.Digest{}, err
		}
		if _, err := io.Copy(io.Discard, rc); err != nil {
			return nil, name.Digest{}, err
		}
		rc.Close()
	}
	return img, byDigest, nil
}

// file is one file of the image, as its report lists it.
type file struct {
	Path string `json:"path"`
	Mode string `json:"mode"`
	UID  int    `json:"uid"`
	GID  int    `json:"gid"`
	Size int64  `json:"size"`
}

// extract unpacks img's filesystem into dir, when dir is not empty, and
// returns its files and their total size.
func extract(img v1.Image, dir string) ([]file, int64, error) {
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	var files []file
	var total int64
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, 0, err
		}
		files = append(files, file{Path: "/" + hdr.Name, Mode: os.FileMode(hdr.Mode).String(), UID: hdr.Uid, GID: hdr.Gid, Size: hdr.Size})
		total += hdr.Size
		if dir == "" {
			continue
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil, 0, fmt.Errorf("%s: only regular files are expected in the image", hdr.Name)
		}
		to := filepath.Join(dir, filepath.FromSlash(hdr.Name))
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return nil, 0, err
		}
		f, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(hdr.Mode).Perm())
		if err != nil {
			return nil, 0, err
		}
		if _, err := io.Copy(f, tr); err != nil {
			f.Close()
			return nil, 0, err
		}
		if err := f.Close(); err != nil {
			return nil, 0, err
		}
		if err := os.Lchown(to, hdr.Uid, hdr.Gid); err != nil {
			return nil, 0, err
		}
	}
	slices.SortFunc(files, func(a, b file) int { return strings.Compare(a.Path, b.Path) })
	return files, total, nil
}
