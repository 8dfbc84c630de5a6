package integration

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/keyutil"

	"github.com/cached-apiserver/cached-apiserver/pkg/pki"
)

const assignmentsPath = "/apis/fleet.example.com/v1beta1/namespaces/default/assignments"

func testBadInput(t *testing.T, s *testServer) {
	httpClient, err := rest.HTTPClientFor(s.Config)
	if err != nil {
		t.Fatal(err)
	}
	valid := func(mutate func(m map[string]any)) string {
		obj := map[string]any{
			"apiVersion": "fleet.example.com/v1beta1", "kind": "Assignment",
			"metadata": map[string]any{"name": "bad-input"},
			"spec":     map[string]any{"agentName": "agent-a"},
		}
		if mutate != nil {
			mutate(obj)
		}
		b, _ := json.Marshal(obj)
		return string(b)
	}
	spec := func(k string, v any) func(map[string]any) {
		return func(m map[string]any) { m["spec"].(map[string]any)[k] = v }
	}
	tests := []struct {
		name        string
		method      string
		path        string
		contentType string
		body        string
		wantCode    int
		wantReason  metav1.StatusReason
		wantMessage string
	}{
		{name: "malformed JSON", method: "POST", path: assignmentsPath, body: `{"apiVersion": "fleet.example.com/v1beta1", "kind": `,
			wantCode: 400, wantReason: metav1.StatusReasonBadRequest, wantMessage: "unexpected end of JSON input"},
		{name: "invalid object", method: "POST", path: assignmentsPath, body: valid(spec("priority", 5000)),
			wantCode: 422, wantReason: metav1.StatusReasonInvalid, wantMessage: "spec.priority"},
		{name: "missing agent", method: "POST", path: assignmentsPath, body: valid(func(m map[string]any) { delete(m, "spec") }),
			wantCode: 422, wantReason: metav1.StatusReasonInvalid, wantMessage: "spec.agentName: Required value"},
		{name: "payload over the limit", method: "POST", path: assignmentsPath, body: valid(spec("payload", strings.Repeat("x", 256*1024+1))),
			wantCode: 422, wantReason: metav1.StatusReasonInvalid, wantMessage: "spec.payload: Too long"},
		{name: "unknown field with strict validation", method: "POST", path: assignmentsPath + "?fieldValidation=Strict", body: valid(spec("colour", "red")),
			wantCode: 400, wantReason: metav1.StatusReasonBadRequest, wantMessage: `unknown field "spec.colour"`},
		{name: "bad resourceVersion on list", method: "GET", path: assignmentsPath + "?resourceVersion=yesterday",
			wantCode: 400, wantReason: metav1.StatusReasonBadRequest, wantMessage: `invalid resourceVersion "yesterday"`},
		{name: "bad resourceVersion on watch", method: "GET", path: assignmentsPath + "?watch=true&resourceVersion=-1",
			wantCode: 400, wantReason: metav1.StatusReasonBadRequest, wantMessage: `invalid resourceVersion "-1"`},
		{name: "bad resourceVersion on get", method: "GET", path: assignmentsPath + "/x?resourceVersion=1.5",
			wantCode: 400, wantReason: metav1.StatusReasonBadRequest, wantMessage: `invalid resourceVersion "1.5"`},
		{name: "unsupported field selector", method: "GET", path: assignmentsPath + "?fieldSelector=spec.payload%3Dx",
			wantCode: 400, wantReason: metav1.StatusReasonBadRequest, wantMessage: "supported field selectors are: metadata.name, metadata.namespace, spec.agentName, status.phase"},
		{name: "malformed label selector", method: "GET", path: assignmentsPath + "?labelSelector=a%3D%3D%3Db",
			wantCode: 400, wantReason: metav1.StatusReasonBadRequest, wantMessage: "unable to parse requirement"},
		{name: "wrong content type", method: "POST", path: assignmentsPath, contentType: "text/plain", body: valid(nil),
			wantCode: 415, wantReason: metav1.StatusReasonUnsupportedMediaType, wantMessage: "accepted media types include: application/json"},
		{name: "body over the request size limit", method: "POST", path: assignmentsPath, body: valid(spec("payload", strings.Repeat("x", 3*1024*1024+1))),
			wantCode: 413, wantReason: metav1.StatusReasonRequestEntityTooLarge, wantMessage: "limit is 3145728"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, s.URL+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			ct := tc.contentType
			if ct == "" {
				ct = "application/json"
			}
			req.Header.Set("Content-Type", ct)
			req.Header.Set("Accept", "application/json")
			status := doStatus(t, httpClient, req)
			if int(status.Code) != tc.wantCode || status.Reason != tc.wantReason || !strings.Contains(status.Message, tc.wantMessage) {
				t.Fatalf("got %d %s %q, want %d %s containing %q", status.Code, status.Reason, status.Message,
					tc.wantCode, tc.wantReason, tc.wantMessage)
			}
		})
	}
	// Nothing was created by any of it.
	list, err := s.Client.FleetV1beta1().Assignments("default").List(t.Context(), metav1.ListOptions{FieldSelector: "metadata.name=bad-input"})
	if err != nil || len(list.Items) != 0 {
		t.Fatalf("bad input left objects behind: %v %v", list, err)
	}
}

// testSerializers checks that no client can negotiate protobuf, which the
// fleet types cannot encode.
func testSerializers(t *testing.T, s *testServer) {
	httpClient, err := rest.HTTPClientFor(s.Config)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		accept   string
		wantCode int
		wantType string
	}{
		{accept: "application/vnd.kubernetes.protobuf", wantCode: 406},
		{accept: "application/vnd.kubernetes.protobuf, application/json", wantCode: 200, wantType: "application/json"},
		{accept: "application/json", wantCode: 200, wantType: "application/json"},
		{accept: "application/yaml", wantCode: 200, wantType: "application/yaml"},
	}
	for _, tc := range tests {
		t.Run(tc.accept, func(t *testing.T) {
			req, _ := http.NewRequest("GET", s.URL+assignmentsPath, nil)
			req.Header.Set("Accept", tc.accept)
			resp, err := httpClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.wantCode {
				t.Fatalf("code %d, want %d: %s", resp.StatusCode, tc.wantCode, body)
			}
			if tc.wantCode == 406 && !bytes.Contains(body, []byte("application/json")) {
				t.Fatalf("406 must name the available representations: %q", body)
			}
			if tc.wantType != "" && !strings.HasPrefix(resp.Header.Get("Content-Type"), tc.wantType) {
				t.Fatalf("content type %q, want %q", resp.Header.Get("Content-Type"), tc.wantType)
			}
		})
	}
}

func testAuthentication(t testing.TB, s *testServer) {
	ca, err := os.ReadFile(filepath.Join(s.DataDir, "pki", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	client := func(certs ...tls.Certificate) *http.Client {
		return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: certs}}}
	}
	get := func(c *http.Client) *metav1.Status {
		req, _ := http.NewRequest("GET", s.URL+assignmentsPath, nil)
		req.Header.Set("Accept", "application/json")
		return doStatus(t, c, req)
	}
	if st := get(client()); st.Code != 401 || st.Reason != metav1.StatusReasonUnauthorized {
		t.Fatalf("anonymous: got %d %s, want 401 Unauthorized", st.Code, st.Reason)
	}
	alice := signClientCert(t, s.DataDir, "alice", "developers")
	if st := get(client(alice)); st.Code != 403 || st.Reason != metav1.StatusReasonForbidden || !strings.Contains(st.Message, `User "alice"`) {
		t.Fatalf("non-admin user: got %d %s %q, want 403 Forbidden naming alice", st.Code, st.Reason, st.Message)
	}
}

// doStatus sends req and decodes the answer as a Status, with the HTTP code
// when the body is not one (as for a successful request).
func doStatus(t testing.TB, c *http.Client, req *http.Request) *metav1.Status {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	status := &metav1.Status{}
	if err := json.Unmarshal(body, status); err != nil || status.Kind != "Status" {
		return &metav1.Status{Code: int32(resp.StatusCode), Message: string(body)}
	}
	if int(status.Code) != resp.StatusCode {
		t.Fatalf("Status code %d disagrees with HTTP code %d", status.Code, resp.StatusCode)
	}
	return status
}

// signClientCert issues a client certificate from the server's CA.
func signClientCert(t testing.TB, dataDir, user string, groups ...string) tls.Certificate {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(dataDir, "pki", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(caPEM)
	caCert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := keyutil.PrivateKeyFromFile(filepath.Join(dataDir, "pki", "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	ca := &pki.CA{Cert: caCert, Key: caKey.(*ecdsa.PrivateKey)}
	cert, key, err := ca.Sign(pki.Client(user, groups...))
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key}
}

func mustParseRV(t testing.TB, rv string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(rv, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
