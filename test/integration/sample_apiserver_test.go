package integration

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/storage/etcd3/testserver"
	"k8s.io/client-go/dynamic"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	"k8s.io/utils/ptr"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
)

var flunders = schema.GroupVersionResource{Group: "wardle.example.com", Version: "v1alpha1", Resource: "flunders"}

// startSampleAPIServer runs upstream's sample-apiserver v0.37.2
// (bin/sample-apiserver, built by hack/build-sample-apiserver.sh) behind
// cp's kube-apiserver as its README deploys it: an etcd of its own,
// authentication and authorization delegated to kube-apiserver, its
// generated serving certificate, and the APIService
// v1alpha1.wardle.example.com. Its flags are its defaults otherwise: the
// generic server's, upstream's Cacher. The bench's users may do anything
// to its Flunders.
func startSampleAPIServer(ctx context.Context, b *testing.B, cp *controlPlane) serveTarget {
	bin := testkit.BuildTool(b, "build-sample-apiserver.sh", "sample-apiserver")
	etcd := testserver.RunEtcd(b, nil)
	port := testkit.FreePort(b)
	dir := b.TempDir()
	proc := testkit.StartProcess(b, testkit.ProcessConfig{Name: "sample-apiserver", Bin: bin,
		LogPath: filepath.Join(dir, "sample-apiserver.log"), Grace: 30 * time.Second, Args: []string{
			"--etcd-servers=" + strings.Join(etcd.Endpoints(), ","),
			"--bind-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(port),
			"--cert-dir=" + dir,
			"--kubeconfig=" + cp.Front.Kubeconfig,
			"--authentication-kubeconfig=" + cp.Front.Kubeconfig,
			"--authorization-kubeconfig=" + cp.Front.Kubeconfig,
		}})

	// As toLocalhost does for ours: an ExternalName Service for localhost.
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "sample-apiserver", Namespace: deployNamespace},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost",
			Ports: []corev1.ServicePort{{Name: "https", Port: int32(port)}}}}
	if _, err := cp.Kube.CoreV1().Services(deployNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	apiService := &apiregistrationv1.APIService{ObjectMeta: metav1.ObjectMeta{Name: "v1alpha1.wardle.example.com"},
		Spec: apiregistrationv1.APIServiceSpec{Group: flunders.Group, Version: flunders.Version,
			Service: &apiregistrationv1.ServiceReference{Namespace: deployNamespace, Name: "sample-apiserver", Port: ptr.To(int32(port))},
			// Its serving certificate is self-signed, as in its README.
			InsecureSkipTLSVerify: true, GroupPriorityMinimum: 1000, VersionPriority: 15}}
	if _, err := aggregatorclient.NewForConfigOrDie(cp.Front.Config).ApiregistrationV1().APIServices().Create(ctx, apiService, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	grantBenchGroup(ctx, b, cp, "bench-wardle", flunders.Group)
	cp.waitAPIServices(b, apiService.Name)

	writer := dynamic.NewForConfigOrDie(cp.userConfig(b, gatesWriter, gatesGroup)).Resource(flunders).Namespace(gatesNamespace)
	var list *unstructured.UnstructuredList
	var listErr error
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, listErr = writer.List(ctx, metav1.ListOptions{}) // until RBAC reaches its authorizer
		return listErr == nil, nil
	}); err != nil {
		b.Fatalf("listing flunders as %s: %v", gatesWriter, listErr)
	}
	admin := cp.direct(b, "bench-admin", user.SystemPrivilegedGroup)
	admin.Host = "https://127.0.0.1:" + strconv.Itoa(port)
	admin.TLSClientConfig.CAData, admin.TLSClientConfig.ServerName, admin.TLSClientConfig.Insecure = nil, "", true
	return serveTarget{proc: proc, admin: serveClient(b, admin), rv: list.GetResourceVersion(),
		path: "/apis/wardle.example.com/v1alpha1/namespaces/" + gatesNamespace + "/flunders",
		create: func(ctx context.Context, name string) error {
			f := &unstructured.Unstructured{Object: map[string]any{"apiVersion": flunders.GroupVersion().String(), "kind": "Flunder",
				"metadata": map[string]any{"name": name}}}
			_, err := writer.Create(ctx, f, metav1.CreateOptions{})
			return err
		}}
}
