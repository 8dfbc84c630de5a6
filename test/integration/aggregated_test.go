package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/informers/externalversions"
	"github.com/cached-apiserver/cached-apiserver/pkg/pki"
)

// TestAggregated drives our server in aggregated mode through a real
// kube-aggregator (see aggregator_harness_test.go): discovery, the same
// API checks as TestAPI, watches and a watch-list informer through the
// aggregator's proxy, and request-header authentication.
func TestAggregated(t *testing.T) {
	a := startAggregated(t)
	s := a.Front
	t.Run("Discovery", func(t *testing.T) { testAggregatedDiscovery(t, s) })
	t.Run("CRUDBothVersions", func(t *testing.T) { testCRUDBothVersions(t, s) })
	t.Run("StatusSubresource", func(t *testing.T) { testStatusSubresource(t, s) })
	t.Run("FieldSelectors", func(t *testing.T) { testFieldSelectors(t, s) })
	t.Run("WatchHeadersBeforeFirstEvent", func(t *testing.T) { testWatchHeadersBeforeFirstEvent(t, s) })
	t.Run("WatchOrder", func(t *testing.T) { testWatchOrder(t, s) })
	t.Run("WatchResume", func(t *testing.T) { testWatchResume(t, s) })
	t.Run("WatchAfterCompaction", func(t *testing.T) { testWatchAfterCompaction(t, s) })
	t.Run("WatchList", func(t *testing.T) { testWatchList(t, s) })
	t.Run("WatchListInformer", func(t *testing.T) { testAggregatedInformer(t, s) })
	t.Run("BadInput", func(t *testing.T) { testBadInput(t, s) })
	t.Run("Serializers", func(t *testing.T) { testSerializers(t, s) })
	t.Run("RequestHeaderAuthentication", func(t *testing.T) { testRequestHeaderAuthentication(t, a) })
}

func testAggregatedDiscovery(t testing.TB, s *testServer) {
	client := kubernetes.NewForConfigOrDie(s.Config).Discovery()
	groups, err := client.ServerGroups()
	if err != nil {
		t.Fatal(err)
	}
	var fleet *metav1.APIGroup
	for i := range groups.Groups {
		if groups.Groups[i].Name == "fleet.example.com" {
			fleet = &groups.Groups[i]
		}
	}
	if fleet == nil {
		t.Fatalf("the aggregator's discovery lacks fleet.example.com: %v", groups.Groups)
	}
	var versions []string
	for _, v := range fleet.Versions {
		versions = append(versions, v.Version)
	}
	if !slices.Equal(versions, []string{"v1beta1", "v1alpha1"}) || fleet.PreferredVersion.Version != "v1beta1" {
		t.Fatalf("fleet.example.com versions %v preferred %s, want [v1beta1 v1alpha1] preferring v1beta1",
			versions, fleet.PreferredVersion.Version)
	}
	for _, gv := range []string{"fleet.example.com/v1beta1", "fleet.example.com/v1alpha1"} {
		list, err := client.ServerResourcesForGroupVersion(gv)
		if err != nil {
			t.Fatal(err)
		}
		found := map[string]metav1.APIResource{}
		for _, r := range list.APIResources {
			found[r.Name] = r
		}
		asg := found["assignments"]
		if !asg.Namespaced || !slices.Contains(asg.ShortNames, "asg") || !slices.Contains(asg.Categories, "fleet") ||
			!slices.Contains(asg.Verbs, "watch") || !slices.Contains(asg.Verbs, "deletecollection") {
			t.Errorf("%s assignments: %+v", gv, asg)
		}
		if agt := found["agents"]; agt.Namespaced || !slices.Contains(agt.ShortNames, "agt") {
			t.Errorf("%s agents: %+v", gv, agt)
		}
		for _, sub := range []string{"assignments/status", "agents/status"} {
			if _, ok := found[sub]; !ok {
				t.Errorf("%s lacks %s", gv, sub)
			}
		}
	}
	// The aggregated discovery document (one request for every group, as
	// kubectl asks for it) carries our resources too.
	_, resources, err := client.ServerGroupsAndResources()
	if err != nil {
		t.Fatal(err)
	}
	var fleetVersions int
	for _, list := range resources {
		if strings.HasPrefix(list.GroupVersion, "fleet.example.com/") && len(list.APIResources) > 0 {
			fleetVersions++
		}
	}
	if fleetVersions != 2 {
		t.Fatalf("aggregated discovery has resources for %d fleet.example.com versions, want 2", fleetVersions)
	}
}

// testWatchHeadersBeforeFirstEvent checks that the aggregator's proxy
// passes a watch's response headers on at once: client-go's Watch returns
// only when it has them, and the namespace holds nothing to send yet.
func testWatchHeadersBeforeFirstEvent(t testing.TB, s *testServer) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := s.Client.FleetV1beta1().Assignments("quiet")
	w, err := c.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("a watch of an empty namespace did not start through the aggregator: %v", err)
	}
	defer w.Stop()
	a := newAssignment("first", "agent-a")
	a.Namespace = "quiet"
	if _, err := c.Create(ctx, a, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, w); ev.Type != watch.Added || ev.Object.(*v1beta1.Assignment).Name != "first" {
		t.Fatalf("got %s %v, want ADDED first", ev.Type, ev.Object)
	}
}

// testAggregatedInformer syncs a watch-list informer through the
// aggregator: without the initial-events-end bookmark passing the proxy it
// would never sync.
func testAggregatedInformer(t testing.TB, s *testServer) {
	clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, true)
	const total = 500
	createMany(t, s, "agg-informer", "item", total)
	stop := make(chan struct{})
	defer close(stop)
	factory := externalversions.NewSharedInformerFactoryWithOptions(s.Client, 0, externalversions.WithNamespace("agg-informer"))
	informer := factory.Fleet().V1beta1().Assignments().Informer()
	seen := &events{}
	if _, err := informer.AddEventHandler(seen.handler()); err != nil {
		t.Fatal(err)
	}
	factory.Start(stop)
	if !cache.WaitForCacheSync(stop, informer.HasSynced) {
		t.Fatal("informer never synced")
	}
	if n := len(informer.GetStore().List()); n != total {
		t.Fatalf("synced store holds %d assignments, want %d", n, total)
	}
	c := s.Client.FleetV1beta1().Assignments("agg-informer")
	if err := c.Delete(context.Background(), "item-0007", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	seen.waitFor(t, "delete item-0007")
}

// testRequestHeaderAuthentication talks to our server directly: it trusts
// user headers only from a client certificate the front-proxy CA signed for
// an allowed name, and everyone else is anonymous.
func testRequestHeaderAuthentication(t testing.TB, a *aggregatedServer) {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(a.ServingCA)
	clientWith := func(cn string) *http.Client {
		cert, key, err := a.FrontProxyCA.Sign(pki.Client(cn))
		if err != nil {
			t.Fatal(err)
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs:      pool,
			ServerName:   "cached-apiserver." + deployNamespace + ".svc",
			Certificates: []tls.Certificate{{Certificate: [][]byte{cert.Raw}, PrivateKey: key}},
		}}}
	}
	get := func(c *http.Client, user, group string) *metav1.Status {
		req, _ := http.NewRequest("GET", a.Backend+assignmentsPath, nil)
		req.Header.Set("Accept", "application/json")
		req.Header.Set("X-Remote-User", user)
		req.Header.Set("X-Remote-Group", group)
		return doStatus(t, c, req)
	}
	if st := get(clientWith(frontProxyUser), "alice", "system:masters"); st.Code != 200 {
		t.Fatalf("front proxy asserting alice in system:masters: got %d %s %q, want 200", st.Code, st.Reason, st.Message)
	}
	// A certificate for a name not in --requestheader-allowed-names proves
	// nothing, and its headers are refused.
	if st := get(clientWith("mallory"), "alice", "system:masters"); st.Code != 401 || st.Reason != metav1.StatusReasonUnauthorized {
		t.Fatalf("headers from a certificate not allowed: got %d %s %q, want 401 Unauthorized", st.Code, st.Reason, st.Message)
	}
	// Without a certificate the headers are ignored and the request is
	// anonymous, which only a SubjectAccessReview could authorize. Our
	// server asks the --authorization-kubeconfig for one; the aggregator
	// serves no SubjectAccessReviews, so the generic handler answers 500,
	// as it does in a cluster whose SubjectAccessReviews fail.
	anonymous := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, ServerName: "cached-apiserver." + deployNamespace + ".svc"}}}
	st := get(anonymous, "alice", "system:masters")
	if st.Code != 500 || !strings.Contains(st.Message, "subjectaccessreviews") {
		t.Fatalf("headers without a certificate: got %d %s %q, want 500 from the SubjectAccessReview", st.Code, st.Reason, st.Message)
	}
}
