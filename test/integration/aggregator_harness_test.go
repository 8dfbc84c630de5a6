package integration

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	x509request "k8s.io/apiserver/pkg/authentication/request/x509"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	genericfilters "k8s.io/apiserver/pkg/server/filters"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/apiserver/pkg/storage/etcd3/testserver"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregator "k8s.io/kube-aggregator/pkg/apiserver"
	aggregatorscheme "k8s.io/kube-aggregator/pkg/apiserver/scheme"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	aggregatoropenapi "k8s.io/kube-aggregator/pkg/generated/openapi"
	"sigs.k8s.io/yaml"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/pki"
)

// The harness runs our server in aggregated mode behind a real
// kube-aggregator, both in this process, with no kube-apiserver:
//
//   - artifacts/deploy is rendered by hack/tools/render-manifests, as the
//     README tells a cluster operator to do. Our server runs with the
//     Deployment's arguments and the Secret's serving certificate, and the
//     aggregator gets the rendered APIServices with their caBundle.
//   - The aggregator is k8s.io/kube-aggregator's library with its own etcd.
//     Where a cluster would resolve the Service through EndpointSlices, a
//     static resolver points at our server; where the remote availability
//     controller would probe the Service, the harness marks each APIService
//     Available once our /readyz answers through the Service's TLS name.
//   - Our server authenticates the aggregator's front-proxy requests by
//     request header, against a front-proxy CA the harness makes.
//
// What a kube-apiserver would add is configured the standard way but not
// exercised: the delegated authentication and authorization kubeconfigs
// and --kubeconfig point at the aggregator, which serves no TokenReview,
// SubjectAccessReview or ConfigMaps. So the harness passes the flags a
// cluster's configmap would otherwise supply, skips that lookup, allows the
// OpenAPI paths that RBAC's system:discovery role allows in a cluster, and
// turns off admission and priority-and-fairness, which need core informers.
// Users in system:masters are authorized without a SubjectAccessReview.

const (
	deployNamespace = "fleet-system"
	frontProxyUser  = "front-proxy-client"
)

// harnessFlags are what a cluster would provide, or what the harness must
// turn off for want of a kube-apiserver. See the comment above.
func harnessFlags(aggregatorKubeconfig, frontProxyCA string) []string {
	return []string{
		"--requestheader-client-ca-file", frontProxyCA,
		"--requestheader-allowed-names", frontProxyUser,
		"--authentication-kubeconfig", aggregatorKubeconfig,
		"--authorization-kubeconfig", aggregatorKubeconfig,
		"--kubeconfig", aggregatorKubeconfig,
		"--authentication-skip-lookup",
		"--authorization-always-allow-paths", "/healthz,/readyz,/livez,/openapi/v2,/openapi/v3,/openapi/v3/*",
		"--disable-admission-plugins", "NamespaceLifecycle,MutatingAdmissionWebhook,ValidatingAdmissionWebhook," +
			"ValidatingAdmissionPolicy,MutatingAdmissionPolicy",
		"--enable-priority-and-fairness=false",
		"--embedded-etcd-progress-notify-interval", "1s",
		"--embedded-etcd-log-level", "fatal",
	}
}

// aggregatedServer is our server behind the aggregator.
type aggregatedServer struct {
	// Front is the aggregator: its URL, an admin kubeconfig for it and
	// clients through it.
	Front *testServer
	// Backend is our server's URL, reachable only with a front-proxy
	// certificate or through the aggregator.
	Backend string
	// Manifests holds the rendered artifacts/deploy.
	Manifests string
	// FrontProxyCA signs the certificates our server accepts user headers from.
	FrontProxyCA *pki.CA
	// ServingCA verifies our server's certificate (the APIServices' caBundle).
	ServingCA []byte

	// replicas are how to start each replica again, as after a restart.
	replicas []replica
}

// replica is one of our servers behind the aggregator: where it listens
// and the command line it runs with.
type replica struct {
	addr string
	args []string
	stop func()
}

// restart stops replica i as SIGTERM does and starts it again, on the same
// address with the same data, as a rolling upgrade restarts a pod.
func (a *aggregatedServer) restart(t testing.TB, i int) {
	t.Helper()
	r := &a.replicas[i]
	r.stop()
	var ln net.Listener
	// The port is free once the server stopped; the kernel may take a
	// moment to let it go.
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		var err error
		ln, err = net.Listen("tcp", r.addr)
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("listening on %s again: %v", r.addr, err)
	}
	_, r.stop = runServer(t, ln, r.args)
}

// startAggregated renders the manifests, starts the aggregator and our
// server, registers the APIServices and waits until the aggregator's
// discovery lists fleet.example.com.
func startAggregated(t testing.TB) *aggregatedServer {
	t.Helper()
	a, _ := startAggregatedReplicas(t, 1)
	return a
}

// startAggregatedReplicas is startAggregated with n replicas of our server
// behind the APIService's Service. With more than one they share an etcd
// and the Service resolves to a balancer over them, as kube-proxy spreads
// a Service's endpoints.
func startAggregatedReplicas(t testing.TB, n int, flags ...string) (*aggregatedServer, *testkit.Balancer) {
	t.Helper()
	dir := t.TempDir()
	manifests := renderManifests(t, filepath.Join(dir, "manifests"))

	frontProxyCA, err := pki.NewCA("front-proxy-ca")
	if err != nil {
		t.Fatal(err)
	}
	clientCA, err := pki.NewCA("harness-client-ca")
	if err != nil {
		t.Fatal(err)
	}
	frontProxyCAFile := filepath.Join(dir, "front-proxy-ca.crt")
	clientCAFile := filepath.Join(dir, "client-ca.crt")
	writeFile(t, frontProxyCAFile, pki.EncodeCert(frontProxyCA.Cert))
	writeFile(t, clientCAFile, pki.EncodeCert(clientCA.Cert))
	proxyCert, proxyKey := issue(t, frontProxyCA, pki.Client(frontProxyUser), dir, "front-proxy-client")
	aggServingCert, aggServingKey := issue(t, clientCA, pki.Serving("localhost", []string{"localhost"},
		[]net.IP{net.IPv4(127, 0, 0, 1)}), dir, "aggregator-serving")
	adminCert, adminKey := issue(t, clientCA, pki.Client("harness-admin", user.SystemPrivilegedGroup), dir, "admin")

	aggLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	aggURL := "https://" + aggLn.Addr().String()
	kubeconfig := filepath.Join(dir, "aggregator.kubeconfig")
	writeKubeconfig(t, kubeconfig, aggURL, clientCAFile, adminCert, adminKey)

	var backendLns []net.Listener
	var backendAddrs []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		backendLns = append(backendLns, ln)
		backendAddrs = append(backendAddrs, ln.Addr().String())
	}
	var lb *testkit.Balancer
	backendURL := &url.URL{Scheme: "https", Host: backendAddrs[0]}
	var sharedEtcd []string
	if n > 1 {
		var err error
		if lb, err = testkit.NewBalancer(backendAddrs); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(lb.Close)
		backendURL.Host = lb.Addr()
		sharedEtcd = []string{"--etcd-servers", strings.Join(testserver.RunEtcd(t, nil).Endpoints(), ",")}
	}

	startAggregator(t, aggregatorConfig{
		Listener:        aggLn,
		ServingCert:     aggServingCert,
		ServingKey:      aggServingKey,
		ClientCAFile:    clientCAFile,
		ProxyClientCert: proxyCert,
		ProxyClientKey:  proxyKey,
		Backend:         backendURL,
	})

	// Our server, with the Deployment's arguments.
	var etcdEndpoint string
	var replicas []replica
	for i, ln := range backendLns {
		replicaDir := filepath.Join(dir, fmt.Sprintf("replica-%d", i))
		if err := os.MkdirAll(replicaDir, 0o700); err != nil {
			t.Fatal(err)
		}
		args := deploymentArgs(t, manifests, replicaDir)
		args = append(args, harnessFlags(kubeconfig, frontProxyCAFile)...)
		args = append(append(args, sharedEtcd...), flags...)
		inst, stop := runServer(t, ln, args)
		etcdEndpoint = inst.EtcdEndpoints[0]
		replicas = append(replicas, replica{addr: ln.Addr().String(), args: args, stop: stop})
	}

	front := &testServer{Addr: aggLn.Addr().String(), URL: aggURL, Kubeconfig: kubeconfig, EtcdEndpoint: etcdEndpoint}
	front.connect(t)
	registerAPIServices(t, front.Config, manifests, backendURL)
	waitDiscovered(t, front.Config)
	return &aggregatedServer{Front: front, Backend: backendURL.String(), Manifests: manifests,
		FrontProxyCA: frontProxyCA, ServingCA: servingCA(t, manifests), replicas: replicas}, lb
}

// renderManifests runs the same renderer hack/render-manifests.sh runs
// and returns the directory of the base variant, one object per file
// beside its kustomization.yaml; the ha variant is beside it.
func renderManifests(t testing.TB, out string) string {
	t.Helper()
	return renderManifestsIn(t, out, deployNamespace)
}

// renderManifestsIn is renderManifests for a namespace of the caller's.
func renderManifestsIn(t testing.TB, out, namespace string) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "run", "./hack/tools/render-manifests",
		"-in", "artifacts/deploy", "-out", out, "-namespace", namespace)
	cmd.Dir = root
	if output, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("render-manifests: %v\n%s", err, output)
	}
	return filepath.Join(out, "base")
}

// deploymentArgs returns the rendered Deployment's container arguments,
// with what is specific to a pod replaced for this machine: the bind
// address, the serving certificate's mount and the data directory.
func deploymentArgs(t testing.TB, manifests, dir string) []string {
	t.Helper()
	var deploy appsv1.Deployment
	readManifest(t, filepath.Join(manifests, "deployment.yaml"), &deploy)
	var secret corev1.Secret
	readManifest(t, filepath.Join(manifests, "secret-serving-cert.yaml"), &secret)
	certDir := filepath.Join(dir, "serving-cert")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, data := range secret.Data {
		writeFile(t, filepath.Join(certDir, name), data)
	}

	replace := map[string]string{
		"--bind-address":         "127.0.0.1",
		"--tls-cert-file":        filepath.Join(certDir, corev1.TLSCertKey),
		"--tls-private-key-file": filepath.Join(certDir, corev1.TLSPrivateKeyKey),
		"--data-dir":             filepath.Join(dir, "data"),
	}
	var args []string
	seen := sets.New[string]()
	for _, arg := range deploy.Spec.Template.Spec.Containers[0].Args {
		name, _, _ := strings.Cut(arg, "=")
		seen.Insert(name)
		switch v, ok := replace[name]; {
		case name == "--secure-port": // runServer sets the port of its listener.
		case ok:
			args = append(args, name+"="+v)
		default:
			args = append(args, arg)
		}
	}
	for name := range replace {
		if !seen.Has(name) {
			t.Fatalf("the Deployment no longer passes %s; update the harness", name)
		}
	}
	return args
}

// aggregatorConfig is what startAggregator needs.
type aggregatorConfig struct {
	Listener net.Listener
	// ServingCert and ServingKey are files for the aggregator's own TLS.
	ServingCert, ServingKey string
	// ClientCAFile verifies users' client certificates.
	ClientCAFile string
	// ProxyClientCert and ProxyClientKey identify the aggregator to our server.
	ProxyClientCert, ProxyClientKey string
	// Backend is where every APIService's Service resolves to.
	Backend *url.URL
}

// startAggregator runs k8s.io/kube-aggregator's server over its own etcd
// until the test ends. Users authenticate with client certificates from
// ClientCAFile; system:masters is authorized.
func startAggregator(t testing.TB, cfg aggregatorConfig) {
	t.Helper()
	etcd := testserver.RunEtcd(t, nil)

	opts := genericoptions.NewRecommendedOptions("/kube-aggregator",
		aggregatorscheme.Codecs.LegacyCodec(apiregistrationv1.SchemeGroupVersion))
	opts.Etcd.StorageConfig.Transport.ServerList = etcd.Endpoints()
	opts.SecureServing.Listener = cfg.Listener
	opts.SecureServing.BindPort = cfg.Listener.Addr().(*net.TCPAddr).Port
	opts.SecureServing.ServerCert.CertKey = genericoptions.CertKey{CertFile: cfg.ServingCert, KeyFile: cfg.ServingKey}
	// No kube-apiserver to delegate to: authentication and authorization
	// are set below, and admission and priority-and-fairness are off.
	opts.Authentication = nil
	opts.Authorization = nil
	opts.CoreAPI = nil
	opts.Admission = nil
	opts.Features.EnablePriorityAndFairness = false
	run := genericoptions.NewServerRunOptions()
	if err := run.ComponentGlobalsRegistry.Set(); err != nil {
		t.Fatal(err)
	}
	if err := run.Complete(); err != nil {
		t.Fatal(err)
	}

	config := genericapiserver.NewRecommendedConfig(aggregatorscheme.Codecs)
	if err := run.ApplyTo(&config.Config); err != nil {
		t.Fatal(err)
	}
	if err := opts.ApplyTo(config); err != nil {
		t.Fatal(err)
	}
	ca, err := dynamiccertificates.NewDynamicCAContentFromFile("client-ca", cfg.ClientCAFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := config.Authentication.ApplyClientCert(ca, config.SecureServing); err != nil {
		t.Fatal(err)
	}
	config.Authentication.Authenticator = x509request.NewDynamic(ca.VerifyOptions, x509request.CommonNameUserConversion)
	config.Authorization.Authorizer = authorizerfactory.NewPrivilegedGroups(user.SystemPrivilegedGroup)
	config.MergedResourceConfig = aggregator.DefaultAPIResourceConfigSource()
	config.LongRunningFunc = genericfilters.BasicLongRunningRequestCheck(
		sets.NewString("watch", "proxy"), sets.NewString("attach", "exec", "proxy", "log", "portforward"))
	namer := openapinamer.NewDefinitionNamer(aggregatorscheme.Scheme)
	config.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(aggregatoropenapi.GetOpenAPIDefinitions, namer)
	config.OpenAPIConfig.Info.Title = "kube-aggregator"
	config.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(aggregatoropenapi.GetOpenAPIDefinitions, namer)
	config.OpenAPIV3Config.Info.Title = "kube-aggregator"
	// The aggregator installs its own OpenAPI handlers, merging ours.
	config.SkipOpenAPIInstallation = true
	// The aggregator starts this factory; with the remote availability
	// controller off nothing asks it for an informer.
	config.SharedInformerFactory = informers.NewSharedInformerFactory(
		kubernetes.NewForConfigOrDie(config.LoopbackClientConfig), 0)

	aggConfig := &aggregator.Config{
		GenericConfig: config,
		ExtraConfig: aggregator.ExtraConfig{
			ProxyClientCertFile:                       cfg.ProxyClientCert,
			ProxyClientKeyFile:                        cfg.ProxyClientKey,
			ServiceResolver:                           staticResolver{backend: cfg.Backend},
			DisableRemoteAvailableConditionController: true,
		},
	}
	server, err := aggConfig.Complete().NewWithDelegate(genericapiserver.NewEmptyDelegate())
	if err != nil {
		t.Fatal(err)
	}
	prepared, err := server.PrepareRun()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- prepared.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("aggregator exited with %v", err)
			}
		case <-time.After(time.Minute):
			t.Errorf("aggregator did not stop within a minute")
		}
	})
}

// staticResolver resolves every Service to one URL, in place of the
// EndpointSlices a cluster has.
type staticResolver struct{ backend *url.URL }

func (r staticResolver) ResolveEndpoint(namespace, name string, port int32) (*url.URL, error) {
	if namespace != deployNamespace || name != "cached-apiserver" || port != 443 {
		return nil, fmt.Errorf("no service %s/%s:%d in this harness", namespace, name, port)
	}
	u := *r.backend
	return &u, nil
}

// registerAPIServices creates the rendered APIServices and marks each
// Available once our /readyz answers over TLS verified with its caBundle
// for the Service's name, as the remote availability controller would.
func registerAPIServices(t testing.TB, front *rest.Config, manifests string, backend *url.URL) {
	t.Helper()
	client := aggregatorclient.NewForConfigOrDie(front).ApiregistrationV1().APIServices()
	ctx := context.Background()
	for _, version := range []string{"v1beta1", "v1alpha1"} {
		var svc apiregistrationv1.APIService
		readManifest(t, filepath.Join(manifests, "apiservice-"+version+".yaml"), &svc)
		probe := &rest.Config{
			Host: backend.String(),
			TLSClientConfig: rest.TLSClientConfig{
				CAData:     svc.Spec.CABundle,
				ServerName: svc.Spec.Service.Name + "." + svc.Spec.Service.Namespace + ".svc",
			},
		}
		// Probe before creating: the aggregator's OpenAPI controllers fetch
		// our spec a second after the APIService appears, and a fetch that
		// meets an unavailable APIService backs off for a minute.
		waitReady(t, probe)
		created, err := client.Create(ctx, &svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status.Conditions = []apiregistrationv1.APIServiceCondition{{
			Type:               apiregistrationv1.Available,
			Status:             apiregistrationv1.ConditionTrue,
			LastTransitionTime: metav1.Now(),
			Reason:             "Passed",
			Message:            "the harness probed /readyz",
		}}
		if _, err := client.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// waitDiscovered waits until the aggregator serves both versions in
// discovery and in its merged OpenAPI v3 (which kubectl explain reads). The
// aggregator fills both asynchronously after an APIService turns Available.
func waitDiscovered(t testing.TB, cfg *rest.Config) {
	t.Helper()
	client := kubernetes.NewForConfigOrDie(cfg).Discovery()
	wantPaths := []string{"apis/fleet.example.com/v1beta1", "apis/fleet.example.com/v1alpha1"}
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 2*time.Minute, true,
		func(context.Context) (bool, error) {
			// The aggregated discovery document, with each version's resources.
			_, resources, err := client.ServerGroupsAndResources()
			if err != nil {
				return false, nil
			}
			served := 0
			for _, list := range resources {
				if strings.HasPrefix(list.GroupVersion, "fleet.example.com/") && len(list.APIResources) > 0 {
					served++
				}
			}
			if served != 2 {
				return false, nil
			}
			paths, err := client.OpenAPIV3().Paths()
			if err != nil {
				return false, nil
			}
			for _, p := range wantPaths {
				if _, ok := paths[p]; !ok {
					return false, nil
				}
			}
			return true, nil
		})
	if err != nil {
		t.Fatalf("the aggregator never served fleet.example.com in both versions in discovery and OpenAPI v3: %v", err)
	}
}

// servingCA is the rendered APIServices' caBundle.
func servingCA(t testing.TB, manifests string) []byte {
	t.Helper()
	var svc apiregistrationv1.APIService
	readManifest(t, filepath.Join(manifests, "apiservice-v1beta1.yaml"), &svc)
	return svc.Spec.CABundle
}

func readManifest(t testing.TB, path string, into any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// issue signs tmpl with ca and writes dir/name.crt and dir/name.key.
func issue(t testing.TB, ca *pki.CA, tmpl *x509.Certificate, dir, name string) (certFile, keyFile string) {
	t.Helper()
	cert, key, err := ca.Sign(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := pki.WriteCertKey(certFile, keyFile, cert, key); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func writeKubeconfig(t testing.TB, path, server, caFile, certFile, keyFile string) {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["harness"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: caFile}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificate: certFile, ClientKey: keyFile}
	cfg.Contexts["harness"] = &clientcmdapi.Context{Cluster: "harness", AuthInfo: "admin", Namespace: "default"}
	cfg.CurrentContext = "harness"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
}
