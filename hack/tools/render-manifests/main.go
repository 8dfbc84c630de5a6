// Command render-manifests renders artifacts/deploy for a cluster: it
// generates a CA and a serving certificate for the in-cluster Service,
// puts the certificate in the Secret and the CA in both APIServices'
// caBundle, generates the ha variant's etcd CA with its members' server
// and peer certificates and our server's client certificate, and writes
// the kustomizations (base/ and ha/) with every variable filled in to
// -out, for kubectl apply -k.
package main

import (
	"crypto/x509"
	"encoding/base64"
	"flag"
	"fmt"
	"net"
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
	if err := etcdCertificates(namespace, values); err != nil {
		return err
	}
	var templates []string
	err = filepath.WalkDir(in, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".yaml") {
			templates = append(templates, path)
		}
		return err
	})
	if err != nil {
		return err
	}
	if len(templates) == 0 {
		return fmt.Errorf("no templates in %s", in)
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
		rel, err := filepath.Rel(in, path)
		if err != nil {
			return err
		}
		dst := filepath.Join(out, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(dst, []byte(rendered), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// etcdMembers is the ha variant's etcd StatefulSet's size.
const etcdMembers = 3

// etcdCertificates adds the ha variant's etcd certificates to values, in
// base64: a CA of their own, a server and a peer certificate valid for
// every member's name, and a client certificate for our server.
func etcdCertificates(namespace string, values map[string]string) error {
	ca, err := pki.NewCA("cached-apiserver-etcd-ca")
	if err != nil {
		return err
	}
	service := "etcd." + namespace + ".svc"
	hosts := []string{service, service + ".cluster.local", "localhost"}
	for i := range etcdMembers {
		member := fmt.Sprintf("etcd-%d.%s", i, service)
		hosts = append(hosts, member, member+".cluster.local")
	}
	server := pki.Serving("etcd", hosts, []net.IP{net.IPv4(127, 0, 0, 1)})
	peer := pki.Serving("etcd-peer", hosts, []net.IP{net.IPv4(127, 0, 0, 1)})
	peer.ExtKeyUsage = append(peer.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	values["ETCD_CA"] = base64.StdEncoding.EncodeToString(pki.EncodeCert(ca.Cert))
	for prefix, tmpl := range map[string]*x509.Certificate{
		"ETCD_SERVER": server,
		"ETCD_PEER":   peer,
		"ETCD_CLIENT": pki.Client("cached-apiserver"),
	} {
		cert, key, err := ca.Sign(tmpl)
		if err != nil {
			return err
		}
		keyPEM, err := pki.EncodeKey(key)
		if err != nil {
			return err
		}
		values[prefix+"_CRT"] = base64.StdEncoding.EncodeToString(pki.EncodeCert(cert))
		values[prefix+"_KEY"] = base64.StdEncoding.EncodeToString(keyPEM)
	}
	return nil
}
