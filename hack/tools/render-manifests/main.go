// Command render-manifests renders artifacts/deploy for a cluster: it
// generates a CA and a serving certificate for the in-cluster Service,
// puts the certificate in the Secret and the CA in both APIServices'
// caBundle, and writes one file per object to -out.
package main

import (
	"encoding/base64"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cached-apiserver/cached-apiserver/pkg/pki"
)

func main() {
	in := flag.String("in", "artifacts/deploy", "directory of manifest templates")
	out := flag.String("out", "", "directory to write the rendered manifests to (required)")
	namespace := flag.String("namespace", "fleet-system", "namespace to run cached-apiserver in")
	image := flag.String("image", "cached-apiserver:latest", "container image")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "render-manifests: -out is required")
		os.Exit(2)
	}
	if err := render(*in, *out, *namespace, *image); err != nil {
		fmt.Fprintln(os.Stderr, "render-manifests:", err)
		os.Exit(1)
	}
}

func render(in, out, namespace, image string) error {
	ca, err := pki.NewCA("cached-apiserver-ca")
	if err != nil {
		return err
	}
	service := "cached-apiserver." + namespace + ".svc"
	cert, key, err := ca.Sign(pki.Serving(service, []string{service, service + ".cluster.local"}, nil))
	if err != nil {
		return err
	}
	keyPEM, err := pki.EncodeKey(key)
	if err != nil {
		return err
	}
	b64 := base64.StdEncoding.EncodeToString
	values := map[string]string{
		"NAMESPACE": namespace,
		"IMAGE":     image,
		"CA_BUNDLE": b64(pki.EncodeCert(ca.Cert)),
		"TLS_CRT":   b64(pki.EncodeCert(cert)),
		"TLS_KEY":   b64(keyPEM),
	}
	templates, err := filepath.Glob(filepath.Join(in, "*.yaml"))
	if err != nil {
		return err
	}
	if len(templates) == 0 {
		return fmt.Errorf("no templates in %s", in)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, path := range templates {
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var missing []string
		rendered := os.Expand(string(data), func(name string) string {
			v, ok := values[name]
			if !ok {
				missing = append(missing, name)
			}
			return v
		})
		if len(missing) > 0 {
			return fmt.Errorf("%s uses unknown variables %s", path, strings.Join(missing, ", "))
		}
		if err := os.WriteFile(filepath.Join(out, filepath.Base(path)), []byte(rendered), 0o600); err != nil {
			return err
		}
	}
	return nil
}
