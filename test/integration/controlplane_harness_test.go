package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/storage/etcd3/testserver"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned"
	"github.com/cached-apiserver/cached-apiserver/pkg/pki"
)

// The control-plane harness runs a real kube-apiserver (k8s.io/kubernetes
// v1.37.2, built by hack/build-kube-apiserver.sh) as a process over its own
// etcd, and our server in aggregated mode behind it, deployed as a cluster
// operator would deploy it:
//
//   - every rendered manifest of artifacts/deploy is applied with kubectl:
//     the namespace, ServiceAccount, RBAC, Deployment and APIServices;
//   - our server runs with the Deployment's arguments and, as in-cluster
//     config would give it, a kubeconfig with its ServiceAccount's token.
//     It reads the extension-apiserver-authentication ConfigMap, delegates
//     authentication (TokenReview) and authorization (SubjectAccessReview)
//     to the kube-apiserver, and runs admission and priority-and-fairness
//     from core informers on it;
//   - the kube-apiserver's own availability controller turns the APIServices
//     Available, and its aggregator proxies to us.
//
// Two things differ from a cluster, because no kubelet or kube-proxy runs
// here: the Deployment has no pods (our server runs in the test process),
// and the Service is an ExternalName Service for localhost, which the
// aggregator's resolver (proxy.ResolveCluster) turns into
// https://localhost:<APIService port> while still verifying our certificate
// for cached-apiserver.fleet-system.svc. Endpoints may not point at
// loopback, so a ClusterIP Service cannot reach us. The APIServices name
// our loopback port instead of the Service's 443.

// controlPlane is a kube-apiserver with our server behind it.
type controlPlane struct {
	// Front is the kube-apiserver with an admin (system:masters) client.
	Front *testServer
	// Kube is a core client for the kube-apiserver, as admin.
	Kube kubernetes.Interface
	// Backend is our server's URL.
	Backend string
	// KAS is the kube-apiserver's process.
	KAS *testkit.Process

	dir          string
	kasURL       string
	kasCA        string
	clientCA     *pki.CA
	frontProxyCA *pki.CA
	servingCA    []byte
	backendAddr  string
	// manifests are the rendered manifests, as applied.
	manifests  string
	serverArgs []string
	stopServer func()
}

// misconfiguration is what TestControlPlaneCatchesInjectedBugs runs our
// server with: no namespace lifecycle or policy admission and no
// priority-and-fairness. Its SubjectAccessReviews also go through
// allowEverything, as if the server authorized every request.
var misconfiguration = []string{
	"--disable-admission-plugins=NamespaceLifecycle,ValidatingAdmissionPolicy",
	"--enable-priority-and-fairness=false",
}

const injectEnv = "CACHED_APISERVER_CONTROLPLANE_INJECT"

func injectMisconfiguration() bool { return os.Getenv(injectEnv) != "" }

// controlPlaneWait bounds the waits for our server to pick up what the
// tests create in the cluster; shorter where the tests are meant to fail.
func controlPlaneWait() time.Duration {
	if injectMisconfiguration() {
		return 5 * time.Second
	}
	return 30 * time.Second
}

// startControlPlane starts the kube-apiserver, deploys our server behind it
// and waits until the kube-apiserver serves fleet.example.com in discovery
// and OpenAPI. namespaces are created first, for the tests' objects.
func startControlPlane(t testing.TB, namespaces ...string) *controlPlane {
	t.Helper()
	return startControlPlaneWith(t, inProcess{}, namespaces...)
}

// backend is how a control plane runs our server behind the kube-apiserver.
type backend interface {
	// listen returns the address the server will serve on, and a listener
	// on it if the harness is to hand one over.
	listen(t testing.TB) (addr string, ln net.Listener)
	// start runs the server with the rendered manifests, once they are
	// applied, and returns once it answers /readyz.
	start(t testing.TB, cp *controlPlane, manifests string, ln net.Listener)
}

// inProcess runs our server in the test process, with the Deployment's
// arguments and a kubeconfig with the ServiceAccount's token.
type inProcess struct{}

func (inProcess) listen(t testing.TB) (string, net.Listener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln.Addr().String(), ln
}

func (inProcess) start(t testing.TB, cp *controlPlane, manifests string, ln net.Listener) {
	t.Helper()
	cp.serverArgs = append(deploymentArgs(t, manifests, filepath.Join(cp.dir, "server")),
		cp.serverKubeconfigFlags(t)...)
	cp.serverArgs = append(cp.serverArgs,
		"--embedded-etcd-progress-notify-interval", "1s",
		"--embedded-etcd-log-level", "fatal")
	if injectMisconfiguration() {
		cp.serverArgs = append(cp.serverArgs, misconfiguration...)
	}
	_, cp.stopServer = runServer(t, ln, cp.serverArgs)
	waitReady(t, cp.direct(t, user.SystemPrivilegedGroup, user.SystemPrivilegedGroup))
}

// startControlPlaneWith is startControlPlane with our server run by be.
func startControlPlaneWith(t testing.TB, be backend, namespaces ...string) *controlPlane {
	t.Helper()
	bin := testkit.BuildTool(t, "build-kube-apiserver.sh", "kube-apiserver")
	cp := &controlPlane{dir: t.TempDir()}
	dir := cp.dir
	var err error
	if cp.clientCA, err = pki.NewCA("client-ca"); err != nil {
		t.Fatal(err)
	}
	if cp.frontProxyCA, err = pki.NewCA("front-proxy-ca"); err != nil {
		t.Fatal(err)
	}
	kasServingCA, err := pki.NewCA("kube-apiserver-ca")
	if err != nil {
		t.Fatal(err)
	}
	clientCAFile := filepath.Join(dir, "client-ca.crt")
	frontProxyCAFile := filepath.Join(dir, "front-proxy-ca.crt")
	cp.kasCA = filepath.Join(dir, "kube-apiserver-ca.crt")
	writeFile(t, clientCAFile, pki.EncodeCert(cp.clientCA.Cert))
	writeFile(t, frontProxyCAFile, pki.EncodeCert(cp.frontProxyCA.Cert))
	writeFile(t, cp.kasCA, pki.EncodeCert(kasServingCA.Cert))
	servingCert, servingKey := issue(t, kasServingCA, pki.Serving("kube-apiserver",
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 96, 0, 1)}), dir, "kube-apiserver")
	proxyCert, proxyKey := issue(t, cp.frontProxyCA, pki.Client(frontProxyUser), dir, "front-proxy-client")
	// The service-account signing key; the public half is derived from it.
	_, saKey := issue(t, cp.clientCA, pki.Client("unused"), dir, "service-account")

	port := testkit.FreePort(t)
	cp.kasURL = "https://127.0.0.1:" + strconv.Itoa(port)
	etcd := testserver.RunEtcd(t, nil)
	cp.KAS = testkit.StartProcess(t, testkit.ProcessConfig{Bin: bin, LogPath: filepath.Join(dir, "kube-apiserver.log"), Grace: 30 * time.Second, Args: []string{
		"--etcd-servers=" + strings.Join(etcd.Endpoints(), ","),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + servingCert,
		"--tls-private-key-file=" + servingKey,
		"--client-ca-file=" + clientCAFile,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + saKey,
		"--service-account-signing-key-file=" + saKey,
		"--service-cluster-ip-range=10.96.0.0/24",
		"--authorization-mode=Node,RBAC",
		"--requestheader-client-ca-file=" + frontProxyCAFile,
		"--requestheader-allowed-names=" + frontProxyUser,
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--requestheader-uid-headers=X-Remote-Uid",
		"--proxy-client-cert-file=" + proxyCert,
		"--proxy-client-key-file=" + proxyKey,
		// No kube-proxy or nodes: the kubernetes Service's endpoints would
		// point at loopback, which nothing here needs.
		"--endpoint-reconciler-type=none",
	}})

	cp.Front = &testServer{Addr: "127.0.0.1:" + strconv.Itoa(port), URL: cp.kasURL,
		Kubeconfig: cp.userKubeconfig(t, "harness-admin", user.SystemPrivilegedGroup)}
	cp.Front.connect(t)
	cp.Kube = kubernetes.NewForConfigOrDie(cp.Front.Config)
	for _, ns := range namespaces {
		cp.createNamespace(t, ns)
	}

	// Deploy: everything but the APIServices first, so that the
	// kube-apiserver's OpenAPI controller does not meet an unavailable
	// service and back off.
	manifests := renderManifests(t, filepath.Join(dir, "manifests"))
	cp.manifests = manifests
	cp.servingCA = servingCA(t, manifests)
	var ln net.Listener
	cp.backendAddr, ln = be.listen(t)
	_, portStr, err := net.SplitHostPort(cp.backendAddr)
	if err != nil {
		t.Fatal(err)
	}
	backendPort, err := strconv.Atoi(portStr)
	if err != nil {
		t.Fatal(err)
	}
	cp.Backend = "https://" + cp.backendAddr
	toLocalhost(t, manifests, backendPort)
	k := newKubectl(t, cp.Front)
	var apiservices []string
	for _, f := range mustGlob(t, filepath.Join(manifests, "*.yaml")) {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		if strings.HasPrefix(filepath.Base(f), "apiservice-") {
			apiservices = append(apiservices, f)
			continue
		}
		// The namespace first: 00-namespace.yaml sorts first.
		k.run(t, "apply", "-f", f)
	}

	be.start(t, cp, manifests, ln)

	for _, f := range apiservices {
		k.run(t, "apply", "-f", f)
	}
	cp.waitAvailable(t)
	waitDiscovered(t, cp.Front.Config)
	return cp
}

// toLocalhost rewrites the rendered Service into an ExternalName Service
// for localhost and points the APIServices at our loopback port (see the
// comment at the top of this file).
func toLocalhost(t testing.TB, manifests string, port int) {
	t.Helper()
	path := filepath.Join(manifests, "service.yaml")
	var svc corev1.Service
	readManifest(t, path, &svc)
	svc.Spec = corev1.ServiceSpec{
		Type:         corev1.ServiceTypeExternalName,
		ExternalName: "localhost",
		Ports:        []corev1.ServicePort{{Name: "https", Port: int32(port)}},
	}
	writeYAML(t, path, &svc)
	for _, version := range []string{"v1beta1", "v1alpha1"} {
		path := filepath.Join(manifests, "apiservice-"+version+".yaml")
		var apiService apiregistrationv1.APIService
		readManifest(t, path, &apiService)
		p := int32(port)
		apiService.Spec.Service.Port = &p
		writeYAML(t, path, &apiService)
	}
}

// serverKubeconfigFlags writes a kubeconfig with the ServiceAccount's token,
// as in-cluster config would give the pod, and points every client of our
// server at it. No --authentication-skip-lookup: the server reads the
// extension-apiserver-authentication ConfigMap.
func (cp *controlPlane) serverKubeconfigFlags(t testing.TB) []string {
	t.Helper()
	token, err := cp.Kube.CoreV1().ServiceAccounts(deployNamespace).CreateToken(context.Background(), "cached-apiserver",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["cluster"] = &clientcmdapi.Cluster{Server: cp.kasURL, CertificateAuthority: cp.kasCA}
	cfg.AuthInfos["cached-apiserver"] = &clientcmdapi.AuthInfo{Token: token.Status.Token}
	cfg.Contexts["cluster"] = &clientcmdapi.Context{Cluster: "cluster", AuthInfo: "cached-apiserver"}
	cfg.CurrentContext = "cluster"
	path := filepath.Join(cp.dir, "server.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	authz := path
	if injectMisconfiguration() {
		authz = cp.allowEverything(t, token.Status.Token)
	}
	return []string{"--kubeconfig", path, "--authentication-kubeconfig", path, "--authorization-kubeconfig", authz}
}

// allowEverything is the injected authorization bug: a proxy in front of
// the kube-apiserver that answers every SubjectAccessReview with allowed.
// It returns a kubeconfig for it.
func (cp *controlPlane) allowEverything(t testing.TB, token string) string {
	t.Helper()
	target, err := url.Parse(cp.kasURL)
	if err != nil {
		t.Fatal(err)
	}
	tlsConfig, err := rest.TLSConfigFor(&rest.Config{TLSClientConfig: rest.TLSClientConfig{CAFile: cp.kasCA}})
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = &http.Transport{TLSClientConfig: tlsConfig}
	director := proxy.Director
	proxy.Director = func(req *http.Request) {
		director(req)
		// The reviews go out as protobuf; ask for answers in JSON. client-go
		// sends no token over plain HTTP: the proxy adds it.
		req.Header.Set("Accept", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
	}
	proxy.ModifyResponse = func(res *http.Response) error {
		if !strings.HasSuffix(res.Request.URL.Path, "/subjectaccessreviews") || res.StatusCode != http.StatusCreated {
			return nil
		}
		var review authorizationv1.SubjectAccessReview
		if err := json.NewDecoder(res.Body).Decode(&review); err != nil {
			return err
		}
		res.Body.Close()
		review.Status = authorizationv1.SubjectAccessReviewStatus{Allowed: true, Reason: "injected"}
		body, err := json.Marshal(&review)
		if err != nil {
			return err
		}
		res.Body = io.NopCloser(bytes.NewReader(body))
		res.ContentLength = int64(len(body))
		res.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["cluster"] = &clientcmdapi.Cluster{Server: srv.URL}
	cfg.AuthInfos["cached-apiserver"] = &clientcmdapi.AuthInfo{}
	cfg.Contexts["cluster"] = &clientcmdapi.Context{Cluster: "cluster", AuthInfo: "cached-apiserver"}
	cfg.CurrentContext = "cluster"
	path := filepath.Join(cp.dir, "allow-everything.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// restartServer stops our server gracefully, as SIGTERM does, and starts it
// again on the same address and data directory.
func (cp *controlPlane) restartServer(t testing.TB) {
	t.Helper()
	cp.stopServer()
	ln, err := net.Listen("tcp", cp.backendAddr)
	if err != nil {
		t.Fatal(err)
	}
	_, cp.stopServer = runServer(t, ln, cp.serverArgs)
	waitReady(t, cp.direct(t, user.SystemPrivilegedGroup, user.SystemPrivilegedGroup))
}

// waitAvailable waits until the kube-apiserver's availability controller
// marks both APIServices Available.
func (cp *controlPlane) waitAvailable(t testing.TB) {
	t.Helper()
	cp.waitAPIServices(t, "v1beta1.fleet.example.com", "v1alpha1.fleet.example.com")
}

// waitAPIServices waits until the kube-apiserver marks the named
// APIServices Available.
func (cp *controlPlane) waitAPIServices(t testing.TB, names ...string) {
	t.Helper()
	client := aggregatorclient.NewForConfigOrDie(cp.Front.Config).ApiregistrationV1().APIServices()
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 2*time.Minute, true,
		func(ctx context.Context) (bool, error) {
			for _, name := range names {
				svc, err := client.Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					last = err.Error()
					return false, nil
				}
				available := false
				for _, c := range svc.Status.Conditions {
					if c.Type == apiregistrationv1.Available {
						available = c.Status == apiregistrationv1.ConditionTrue
						last = fmt.Sprintf("%s: %s %s: %s", name, c.Status, c.Reason, c.Message)
					}
				}
				if !available {
					return false, nil
				}
			}
			return true, nil
		})
	if err != nil {
		t.Fatalf("the kube-apiserver never marked the APIServices Available (last: %s): %v", last, err)
	}
}

func (cp *controlPlane) createNamespace(t testing.TB, name string) {
	t.Helper()
	_, err := cp.Kube.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// userKubeconfig writes a kubeconfig for the kube-apiserver with a client
// certificate for name in groups, and returns its path.
func (cp *controlPlane) userKubeconfig(t testing.TB, name string, groups ...string) string {
	t.Helper()
	cert, key := issue(t, cp.clientCA, pki.Client(name, groups...), cp.dir, "user-"+name)
	path := filepath.Join(cp.dir, name+".kubeconfig")
	writeKubeconfig(t, path, cp.kasURL, cp.kasCA, cert, key)
	return path
}

// user is a client for the kube-apiserver as name in groups.
func (cp *controlPlane) user(t testing.TB, name string, groups ...string) versioned.Interface {
	t.Helper()
	return versioned.NewForConfigOrDie(cp.userConfig(t, name, groups...))
}

// userConfig is an unthrottled config for the kube-apiserver as name in
// groups.
func (cp *controlPlane) userConfig(t testing.TB, name string, groups ...string) *rest.Config {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", cp.userKubeconfig(t, name, groups...))
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = -1, -1
	return cfg
}

// direct is a config for our server itself, bypassing the kube-apiserver,
// that presents the front-proxy client certificate and asserts name and
// groups in request headers, as the aggregator does when it proxies.
func (cp *controlPlane) direct(t testing.TB, name string, groups ...string) *rest.Config {
	t.Helper()
	cert, key, err := cp.frontProxyCA.Sign(pki.Client(frontProxyUser))
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := pki.EncodeKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cfg := cp.directAnonymous()
	cfg.CertData, cfg.KeyData = pki.EncodeCert(cert), keyPEM
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return headers{rt: rt, name: name, groups: groups}
	}
	return cfg
}

// directAnonymous is a config for our server that only verifies its
// serving certificate, for the Service's name as the aggregator does.
func (cp *controlPlane) directAnonymous() *rest.Config {
	return &rest.Config{
		Host: cp.Backend,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:     cp.servingCA,
			ServerName: "cached-apiserver." + deployNamespace + ".svc",
		},
		QPS: -1, Burst: -1,
	}
}

// headers sets the front-proxy user headers.
type headers struct {
	rt     http.RoundTripper
	name   string
	groups []string
}

func (h headers) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("X-Remote-User", h.name)
	for _, g := range h.groups {
		req.Header.Add("X-Remote-Group", g)
	}
	return h.rt.RoundTrip(req)
}

func mustGlob(t testing.TB, pattern string) []string {
	t.Helper()
	files, err := filepath.Glob(pattern)
	if err != nil || len(files) == 0 {
		t.Fatalf("no files match %s: %v", pattern, err)
	}
	return files
}

func writeYAML(t testing.TB, path string, obj any) {
	t.Helper()
	data, err := yaml.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, data)
}

// statusOf returns the Status of an API error, or fails.
func statusOf(t testing.TB, err error) metav1.Status {
	t.Helper()
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		t.Fatalf("want an API Status error, got %v", err)
	}
	return status.Status()
}
