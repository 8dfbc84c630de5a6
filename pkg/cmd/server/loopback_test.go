package server

import (
	"crypto/x509"
	"net"
	"net/http"
	"testing"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	genericapiserver "k8s.io/apiserver/pkg/server"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/cached-apiserver/cached-apiserver/pkg/pki"
)

// TestLoopbackClient serves what applySecureServing configured and sends a
// request with its loopback client: the server must present the loopback
// certificate (a P-256 key) by SNI, the client must trust it, and the request
// must carry the bearer token Complete authorizes. The health check must
// fail once the certificate's validity passed.
func TestLoopbackClient(t *testing.T) {
	// The serving certificate as standalone mode makes it, for localhost.
	certs := standalonePKI{dir: t.TempDir()}
	if err := certs.ensure([]string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts := genericoptions.NewSecureServingOptions()
	opts.Listener = ln
	opts.ServerCert.CertKey = genericoptions.CertKey{CertFile: certs.path(servingCert), KeyFile: certs.path(servingKeyFile)}

	clock := clocktesting.NewFakePassiveClock(time.Now())
	c := &genericapiserver.Config{}
	if err := applySecureServing(opts.WithLoopback(), c, clock); err != nil {
		t.Fatal(err)
	}
	loopback := c.LoopbackClientConfig
	if loopback == nil || loopback.BearerToken == "" {
		t.Fatalf("no loopback client with a bearer token: %+v", loopback)
	}

	tokens := make(chan string, 1)
	stop := make(chan struct{})
	stopped, _, err := c.SecureServing.Serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tokens <- r.Header.Get("Authorization")
	}), time.Second, stop)
	if err != nil {
		t.Fatal(err)
	}
	var hc *http.Client
	t.Cleanup(func() {
		if hc != nil {
			utilnet.CloseIdleConnectionsFor(hc.Transport)
		}
		close(stop)
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Error("the server did not stop within 10 s")
		}
	})
	hc, err = rest.HTTPClientFor(loopback)
	if err != nil {
		t.Fatal(err)
	}
	hc.Timeout = 10 * time.Second
	resp, err := hc.Get(loopback.Host + "/")
	if err != nil {
		t.Fatalf("the loopback client's request: %v", err)
	}
	resp.Body.Close()
	if got := resp.TLS.PeerCertificates[0]; got.PublicKeyAlgorithm != x509.ECDSA || got.DNSNames[0] != genericapiserver.LoopbackClientServerNameOverride {
		t.Errorf("the server presented %v for %v, want the loopback certificate's P-256 key", got.PublicKeyAlgorithm, got.DNSNames)
	}
	if got, want := <-tokens, "Bearer "+loopback.BearerToken; got != want {
		t.Errorf("the request carried %q, want %q", got, want)
	}

	var check func(*http.Request) error
	for _, lc := range c.LivezChecks {
		if lc.Name() == "loopback-serving-certificate" {
			check = lc.Check
		}
	}
	if check == nil {
		t.Fatal("no loopback-serving-certificate livez check")
	}
	if err := check(nil); err != nil {
		t.Errorf("a new certificate fails its check: %v", err)
	}
	clock.SetTime(clock.Now().Add(pki.Validity + time.Second))
	if check(nil) == nil {
		t.Error("the check passes after the certificate expired")
	}
}
