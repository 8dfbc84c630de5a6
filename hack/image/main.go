// Command image builds the image users deploy, and the OCI bundle that runs
// it as the Deployment would. A module of its own, so that
// go-containerregistry and the OCI runtime spec are never dependencies of the
// server's.
//
//	image build -dockerfile Dockerfile -context . -tag cached-apiserver:v0 -out bin/image.tar [-rootfs dir] [-report file]
//
// builds the image the Dockerfile describes without a container engine,
// pushes it to go-containerregistry's in-process registry and pulls it back
// by digest, as a cluster would, and writes it as a tarball that `docker
// load` and `podman load` read; with -rootfs, also its filesystem, for a
// bundle. It prints the reference and the image's size and files.
//
//	image bundle -deployment d.yaml -secret s.yaml -rootfs dir -image-report file -kube-host h -kube-port p -token file -kube-ca file -out dir
//
// turns a rendered Deployment's pod into an OCI bundle for runc: see bundle.go.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
)

func main() {
	if len(os.Args) < 2 {
		log.Fatal("usage: image build|bundle [flags]")
	}
	var err error
	switch os.Args[1] {
	case "build":
		err = runBuild(os.Args[2:])
	case "bundle":
		err = runBundle(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want build or bundle", os.Args[1])
	}
	if err != nil {
		log.Fatal(err)
	}
}

// report is what image build writes of the image it built.
type report struct {
	// Reference is the image's tag, and Digest its digest: the reference
	// hack/render-manifests.sh -image takes is Reference, or
	// Reference@Digest once pushed as is.
	Reference string `json:"reference"`
	Digest    string `json:"digest"`
	// Size is the sum of the files' sizes: the image uncompressed, but for
	// its tar headers and config.
	Size       int64    `json:"size"`
	Files      []file   `json:"files"`
	User       string   `json:"user"`
	Entrypoint []string `json:"entrypoint"`
}

func runBuild(args []string) error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	dockerfilePath := fs.String("dockerfile", "Dockerfile", "the Dockerfile to build")
	context := fs.String("context", ".", "the build context the Dockerfile's COPY reads")
	tag := fs.String("tag", "cached-apiserver:dev", "the image's reference")
	out := fs.String("out", "bin/image.tar", "where to write the image, as a tarball docker load and podman load read")
	rootfs := fs.String("rootfs", "", "if set, where to unpack the image's filesystem")
	reportPath := fs.String("report", "", "if set, where to write the report as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	f, err := os.Open(*dockerfilePath)
	if err != nil {
		return err
	}
	d, err := parseDockerfile(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", *dockerfilePath, err)
	}
	img, err := buildImage(d, *context)
	if err != nil {
		return err
	}
	ref, err := parseTag(*tag)
	if err != nil {
		return err
	}
	img, byDigest, err := roundTrip(img, ref.RepositoryStr(), ref.TagStr())
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	if err := writeTarball(*out, ref, img); err != nil {
		return err
	}
	files, size, err := extract(img, *rootfs)
	if err != nil {
		return err
	}
	r := report{Reference: ref.String(), Digest: byDigest.DigestStr(), Size: size, Files: files, User: d.user, Entrypoint: d.entry}
	if *reportPath != "" {
		data, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*reportPath, data, 0o644); err != nil {
			return err
		}
	}
	printReport(os.Stdout, r, *out)
	return nil
}

// printReport says what was built and what to do with it.
func printReport(w io.Writer, r report, out string) {
	fmt.Fprintf(w, "image %s\n  digest %s, %.1f MiB uncompressed, user %s, entrypoint %v\n", r.Reference, r.Digest,
		float64(r.Size)/(1<<20), r.User, r.Entrypoint)
	for _, f := range r.Files {
		fmt.Fprintf(w, "  %s %d:%d %9d %s\n", f.Mode, f.UID, f.GID, f.Size, f.Path)
	}
	fmt.Fprintf(w, "written to %s; load it into Docker or Podman and push it:\n", out)
	fmt.Fprintf(w, "  podman load -i %s && podman push %s\n", out, r.Reference)
	fmt.Fprintf(w, "then render the manifests with it:\n")
	fmt.Fprintf(w, "  hack/render-manifests.sh <dir> -namespace fleet-system -image %s\n", r.Reference)
}
