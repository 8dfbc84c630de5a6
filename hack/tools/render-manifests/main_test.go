package main

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// TestRenderManifests runs hack/render-manifests.sh and parses every
// rendered object: the APIServices' CA must verify the Secret's serving
// certificate for the Service's DNS name, and the RBAC must aggregate.
func TestRenderManifests(t *testing.T) {
	out := t.TempDir()
	cmd := exec.Command("../../render-manifests.sh", out, "-namespace", "fleet-test", "-image", "example.com/cached-apiserver:v1")
	if output, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("render-manifests.sh: %v\n%s", err, output)
	}
	files, err := filepath.Glob(filepath.Join(out, "base", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objects := map[string]*unstructured.Unstructured{}
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(data), "\n---") {
			t.Errorf("%s holds more than one object", filepath.Base(f))
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &u.Object); err != nil {
			t.Fatalf("%s: %v", filepath.Base(f), err)
		}
		if strings.Contains(string(data), "${") {
			t.Errorf("%s still has a placeholder", filepath.Base(f))
		}
		objects[u.GetKind()+"/"+u.GetNamespace()+"/"+u.GetName()] = u
	}
	for _, want := range []string{
		"Namespace//fleet-test", "ServiceAccount/fleet-test/cached-apiserver", "Deployment/fleet-test/cached-apiserver",
		"Service/fleet-test/cached-apiserver", "Secret/fleet-test/cached-apiserver-serving-cert",
		"APIService//v1beta1.fleet.example.com", "APIService//v1alpha1.fleet.example.com",
		"ClusterRoleBinding//cached-apiserver:system:auth-delegator", "RoleBinding/kube-system/cached-apiserver-auth-reader",
		"ClusterRole//fleet.example.com:admin", "ClusterRole//fleet.example.com:edit", "ClusterRole//fleet.example.com:view",
	} {
		if objects[want] == nil {
			t.Errorf("no %s among the rendered objects", want)
		}
	}

	cert := secretCert(t, objects["Secret/fleet-test/cached-apiserver-serving-cert"], "tls.crt")
	for _, version := range []string{"v1beta1", "v1alpha1"} {
		svc := objects["APIService//"+version+".fleet.example.com"]
		if skip, _, _ := unstructured.NestedBool(svc.Object, "spec", "insecureSkipTLSVerify"); skip {
			t.Errorf("%s skips TLS verification", version)
		}
		caB64, _, _ := unstructured.NestedString(svc.Object, "spec", "caBundle")
		caPEM, err := base64.StdEncoding.DecodeString(caB64)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			t.Fatalf("%s caBundle holds no certificate", version)
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "cached-apiserver.fleet-test.svc",
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("%s caBundle does not verify the serving certificate: %v", version, err)
		}
		if ns, _, _ := unstructured.NestedString(svc.Object, "spec", "service", "namespace"); ns != "fleet-test" {
			t.Errorf("%s points at namespace %q", version, ns)
		}
	}
	for role, label := range map[string]string{"admin": "aggregate-to-admin", "edit": "aggregate-to-edit", "view": "aggregate-to-view"} {
		if objects["ClusterRole//fleet.example.com:"+role].GetLabels()["rbac.authorization.k8s.io/"+label] != "true" {
			t.Errorf("fleet.example.com:%s does not aggregate to %s", role, role)
		}
	}
	deploy := objects["Deployment/fleet-test/cached-apiserver"]
	containers, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "containers")
	c := containers[0].(map[string]any)
	if c["image"] != "example.com/cached-apiserver:v1" {
		t.Errorf("image %v", c["image"])
	}
	args := strings.Join(toStrings(c["args"]), " ")
	for _, want := range []string{"--mode=aggregated", "--tls-cert-file=/var/run/serving-cert/tls.crt"} {
		if !strings.Contains(args, want) {
			t.Errorf("deployment args lack %s: %s", want, args)
		}
	}
}

// TestRenderEtcdCertificates renders the ha variant's etcd Secrets and
// checks each certificate against etcd's CA: the server and peer
// certificates for every member's name, the peer one for both ends of a
// peer connection, and our server's for client authentication.
func TestRenderEtcdCertificates(t *testing.T) {
	out := t.TempDir()
	if err := render("../../../artifacts/deploy", out, "fleet-test", "example.com/cached-apiserver:v1"); err != nil {
		t.Fatal(err)
	}
	read := func(name string) *unstructured.Unstructured {
		data, err := os.ReadFile(filepath.Join(out, "ha", name))
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &u.Object); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return u
	}
	certs, client := read("secret-etcd-certs.yaml"), read("secret-etcd-client.yaml")
	pool := x509.NewCertPool()
	pool.AddCert(secretCert(t, certs, "ca.crt"))
	if !secretCert(t, client, "ca.crt").Equal(secretCert(t, certs, "ca.crt")) {
		t.Error("the client Secret's CA is not etcd's")
	}
	for _, tc := range []struct {
		file   string
		cert   *x509.Certificate
		usages []x509.ExtKeyUsage
		hosts  []string
	}{
		{"server.crt", secretCert(t, certs, "server.crt"), []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			[]string{"etcd-0.etcd.fleet-test.svc", "etcd-2.etcd.fleet-test.svc.cluster.local", "localhost"}},
		{"peer.crt as a server", secretCert(t, certs, "peer.crt"), []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			[]string{"etcd-1.etcd.fleet-test.svc"}},
		{"peer.crt as a client", secretCert(t, certs, "peer.crt"), []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, []string{""}},
		{"client tls.crt", secretCert(t, client, "tls.crt"), []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, []string{""}},
	} {
		for _, host := range tc.hosts {
			if _, err := tc.cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: host, KeyUsages: tc.usages}); err != nil {
				t.Errorf("%s for %q: %v", tc.file, host, err)
			}
		}
	}
}

// secretCert parses the PEM certificate in a rendered Secret's data[key].
func secretCert(t *testing.T, secret *unstructured.Unstructured, key string) *x509.Certificate {
	t.Helper()
	b64, _, _ := unstructured.NestedString(secret.Object, "data", key)
	data, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("%s of %s is not PEM", key, secret.GetName())
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func toStrings(v any) []string {
	var out []string
	for _, s := range v.([]any) {
		out = append(out, s.(string))
	}
	return out
}
