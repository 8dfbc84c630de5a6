package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/utils/ptr"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned"
)

// TestControlPlane runs our server behind a real kube-apiserver, deployed
// from the rendered manifests (controlplane_harness_test.go), and checks
// what only a cluster exercises: delegated authentication and
// authorization, admission from the cluster's namespaces and policies,
// priority-and-fairness from the cluster's FlowSchemas, kubectl through the
// kube-apiserver, and an informer across our server's restart. One control
// plane serves every subtest: it takes about 20 s to start.
func TestControlPlane(t *testing.T) {
	cp := startControlPlane(t, "tenant", "capped", "flood", "informed", "chunks", "watched")
	t.Run("rbac", func(t *testing.T) { testControlPlaneRBAC(t, cp) })
	t.Run("authentication", func(t *testing.T) { testControlPlaneAuthentication(t, cp) })
	t.Run("namespace lifecycle", func(t *testing.T) { testNamespaceLifecycle(t, cp) })
	t.Run("validating admission policy", func(t *testing.T) { testValidatingAdmissionPolicy(t, cp) })
	t.Run("priority and fairness", func(t *testing.T) { testPriorityAndFairness(t, cp) })
	t.Run("kubectl", func(t *testing.T) { testKubectl(t, cp.Front) })
	t.Run("informer across a restart", func(t *testing.T) { testInformerAcrossRestart(t, cp) })
	t.Run("kustomize variants", func(t *testing.T) { testDeployVariants(t, cp) })
}

// bind binds the rendered ClusterRole role to users in namespace.
func bind(t testing.TB, cp *controlPlane, namespace, role string, subjects ...rbacv1.Subject) {
	t.Helper()
	_, err := cp.Kube.RbacV1().RoleBindings(namespace).Create(context.Background(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: strings.ReplaceAll(role, ":", "-") + "-" + strconv.Itoa(len(subjects)) + "-" + subjects[0].Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   subjects,
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func userSubject(name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}
}

func assignment(name, agent string, priority int32) *v1beta1.Assignment {
	return &v1beta1.Assignment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1beta1.AssignmentSpec{AgentName: agent, Priority: priority},
	}
}

func testControlPlaneRBAC(t testing.TB, cp *controlPlane) {
	ctx := context.Background()
	bind(t, cp, "tenant", "fleet.example.com:view", userSubject("viewer"))
	bind(t, cp, "tenant", "fleet.example.com:edit", userSubject("editor"))
	if _, err := cp.Front.Client.FleetV1beta1().Assignments("tenant").Create(ctx, assignment("seed", "agent-1", 0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Through the kube-apiserver, which authorizes first, then proxies to
	// us, and we ask it again with a SubjectAccessReview.
	viewer := cp.user(t, "viewer").FleetV1beta1().Assignments("tenant")
	if _, err := viewer.Get(ctx, "seed", metav1.GetOptions{}); err != nil {
		t.Errorf("viewer get: %v", err)
	}
	if _, err := viewer.List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("viewer list: %v", err)
	}
	w, err := viewer.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Errorf("viewer watch: %v", err)
	} else {
		w.Stop()
	}
	_, err = viewer.Create(ctx, assignment("by-viewer", "agent-1", 0), metav1.CreateOptions{})
	wantForbidden(t, err, `assignments.fleet.example.com is forbidden: User "viewer" cannot create resource "assignments" in API group "fleet.example.com" in the namespace "tenant"`)
	if _, err := cp.user(t, "editor").FleetV1beta1().Assignments("tenant").Create(ctx, assignment("by-editor", "agent-1", 0), metav1.CreateOptions{}); err != nil {
		t.Errorf("editor create: %v", err)
	}
	_, err = cp.user(t, "nobody").FleetV1beta1().Assignments("tenant").List(ctx, metav1.ListOptions{})
	wantForbidden(t, err, `assignments.fleet.example.com is forbidden: User "nobody" cannot list resource "assignments" in API group "fleet.example.com" in the namespace "tenant"`)

	// Straight to our server, as the aggregator's proxy: the decision is
	// ours, taken by a SubjectAccessReview to the kube-apiserver (counted
	// by apiserver_delegated_authz_request_total). Users are new to our
	// server, so its authorization cache has nothing for them.
	before := delegatedRequests(t, "apiserver_delegated_authz_request_total")
	direct := func(name string) versioned.Interface {
		return versioned.NewForConfigOrDie(cp.direct(t, name, user.AllAuthenticated))
	}
	if _, err := direct("viewer").FleetV1beta1().Assignments("tenant").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("viewer list straight to our server: %v", err)
	}
	_, err = direct("viewer").FleetV1beta1().Assignments("tenant").Create(ctx, assignment("by-viewer", "agent-1", 0), metav1.CreateOptions{})
	wantForbidden(t, err, `assignments.fleet.example.com is forbidden: User "viewer" cannot create resource "assignments" in API group "fleet.example.com" in the namespace "tenant"`)
	if _, err := direct("editor").FleetV1beta1().Assignments("tenant").Create(ctx, assignment("by-editor-direct", "agent-1", 0), metav1.CreateOptions{}); err != nil {
		t.Errorf("editor create straight to our server: %v", err)
	}
	_, err = direct("nobody").FleetV1beta1().Assignments("tenant").List(ctx, metav1.ListOptions{})
	wantForbidden(t, err, `assignments.fleet.example.com is forbidden: User "nobody" cannot list resource "assignments" in API group "fleet.example.com" in the namespace "tenant"`)
	if got := delegatedRequests(t, "apiserver_delegated_authz_request_total") - before; got < 4 {
		t.Errorf("our server made %v SubjectAccessReviews for 4 decisions, want 4 or more", got)
	}

	// kubectl auth can-i asks the kube-apiserver; it must agree with us.
	for _, tc := range []struct {
		user, verb string
		want       string
	}{
		{"viewer", "list", "yes"},
		{"viewer", "watch", "yes"},
		{"viewer", "create", "no"},
		{"editor", "create", "yes"},
		{"nobody", "list", "no"},
	} {
		k := newKubectl(t, cp.Front)
		k.kubeconfig = cp.userKubeconfig(t, tc.user)
		out, _ := k.tryRun("auth", "can-i", tc.verb, "assignments.fleet.example.com", "-n", "tenant")
		if got := strings.TrimSpace(out); got != tc.want {
			t.Errorf("kubectl auth can-i %s assignments as %s: %q, want %q", tc.verb, tc.user, got, tc.want)
		}
	}
}

func wantForbidden(t testing.TB, err error, message string) {
	t.Helper()
	if !apierrors.IsForbidden(err) {
		t.Errorf("want 403 Forbidden, got %v", err)
		return
	}
	if got := statusOf(t, err).Message; !strings.HasPrefix(got, message) {
		t.Errorf("403 message %q, want it to start with %q", got, message)
	}
}

// testControlPlaneAuthentication sends a ServiceAccount token straight to
// our server, which can only accept it through a TokenReview.
func testControlPlaneAuthentication(t testing.TB, cp *controlPlane) {
	ctx := context.Background()
	sa, err := cp.Kube.CoreV1().ServiceAccounts("tenant").Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "agent"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bind(t, cp, "tenant", "fleet.example.com:view",
		rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace})
	token, err := cp.Kube.CoreV1().ServiceAccounts("tenant").CreateToken(ctx, sa.Name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(600))}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	withToken := func(token string) versioned.Interface {
		cfg := cp.directAnonymous()
		cfg.BearerToken = token
		return versioned.NewForConfigOrDie(cfg)
	}

	before := delegatedRequests(t, "apiserver_delegated_authn_request_total")
	list, err := withToken(token.Status.Token).FleetV1beta1().Assignments("tenant").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("a ServiceAccount token straight to our server: %v", err)
	}
	if len(list.Items) == 0 {
		t.Errorf("the ServiceAccount listed no assignments in tenant")
	}
	if got := delegatedRequests(t, "apiserver_delegated_authn_request_total") - before; got < 1 {
		t.Errorf("our server accepted the token with %v TokenReviews, want 1 or more", got)
	}
	// Allowed to list in tenant only.
	_, err = withToken(token.Status.Token).FleetV1beta1().Assignments("capped").List(ctx, metav1.ListOptions{})
	wantForbidden(t, err, `assignments.fleet.example.com is forbidden: User "system:serviceaccount:tenant:agent" cannot list resource "assignments" in API group "fleet.example.com" in the namespace "capped"`)

	_, err = withToken(token.Status.Token+"x").FleetV1beta1().Assignments("tenant").List(ctx, metav1.ListOptions{})
	if !apierrors.IsUnauthorized(err) {
		t.Errorf("a bad token: want 401 Unauthorized, got %v", err)
	}
}

func testNamespaceLifecycle(t testing.TB, cp *controlPlane) {
	ctx := context.Background()
	_, err := cp.Front.Client.FleetV1beta1().Assignments("no-such-namespace").Create(ctx, assignment("a", "agent-1", 0), metav1.CreateOptions{})
	if !apierrors.IsNotFound(err) || !strings.Contains(err.Error(), `namespaces "no-such-namespace" not found`) {
		t.Errorf("create in a missing namespace: want 404 namespaces \"no-such-namespace\" not found, got %v", err)
	}

	// No namespace controller runs here, so a deleted namespace stays
	// Terminating.
	cp.createNamespace(t, "doomed")
	if _, err := cp.Front.Client.FleetV1beta1().Assignments("doomed").Create(ctx, assignment("before", "agent-1", 0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cp.Kube.CoreV1().Namespaces().Delete(ctx, "doomed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Our server learns of it through its namespace informer, as
	// kube-apiserver's own NamespaceLifecycle admission does: a create in
	// the informer's lag succeeds there too (once CI saw it), and the
	// namespace controller deletes it with the namespace. Once the
	// informer has the deletion, every create is refused; until then a
	// repeated create of the same name gets 409.
	var last error
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, controlPlaneWait(), true, func(context.Context) (bool, error) {
		_, last = cp.Front.Client.FleetV1beta1().Assignments("doomed").Create(ctx, assignment("after", "agent-1", 0), metav1.CreateOptions{})
		return apierrors.IsForbidden(last), nil
	})
	if err != nil {
		t.Fatalf("create in a terminating namespace: want 403, last got %v", last)
	}
	status := statusOf(t, last)
	if status.Details == nil || len(status.Details.Causes) == 0 || status.Details.Causes[0].Type != corev1.NamespaceTerminatingCause {
		t.Errorf("403 for a terminating namespace without the %s cause: %+v", corev1.NamespaceTerminatingCause, status)
	}
	if !strings.Contains(status.Message, "because it is being terminated") {
		t.Errorf("403 message %q does not say the namespace is being terminated", status.Message)
	}
	// Once refused, every create is: the informer does not forget.
	if _, err := cp.Front.Client.FleetV1beta1().Assignments("doomed").Create(ctx, assignment("later", "agent-1", 0), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("a create after the 403 in a terminating namespace: want 403, got %v", err)
	}
}

// testValidatingAdmissionPolicy creates a CEL policy in the cluster, which
// our server must enforce on assignments.
func testValidatingAdmissionPolicy(t testing.TB, cp *controlPlane) {
	ctx := context.Background()
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "priority-cap"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
						Rule: admissionregistrationv1.Rule{
							APIGroups: []string{"fleet.example.com"}, APIVersions: []string{"*"}, Resources: []string{"assignments"},
						},
					},
				}},
			},
			Validations: []admissionregistrationv1.Validation{{
				Expression: "!has(object.spec.priority) || object.spec.priority <= 100",
				Message:    "priority must be at most 100 in this namespace",
			}},
		},
	}
	if _, err := cp.Kube.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "priority-cap"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        "priority-cap",
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: "capped"}},
			},
		},
	}
	if _, err := cp.Kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	capped := cp.Front.Client.FleetV1beta1().Assignments("capped")
	var last error
	// Polled with the test's context: a create cut short by the poll's
	// deadline is no answer.
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, controlPlaneWait(), true, func(context.Context) (bool, error) {
		name := fmt.Sprintf("high-%d", time.Now().UnixNano())
		_, last = capped.Create(ctx, assignment(name, "agent-1", 200), metav1.CreateOptions{})
		return last != nil, nil
	})
	if err != nil {
		t.Fatalf("our server never enforced the policy: %v", err)
	}
	if !apierrors.IsInvalid(last) || !strings.Contains(last.Error(), "priority must be at most 100 in this namespace") ||
		!strings.Contains(last.Error(), "ValidatingAdmissionPolicy 'priority-cap'") {
		t.Errorf("want 422 Invalid from ValidatingAdmissionPolicy 'priority-cap' with the policy's message, got %v", last)
	}
	if _, err := capped.Create(ctx, assignment("low", "agent-1", 50), metav1.CreateOptions{}); err != nil {
		t.Errorf("priority 50 in the capped namespace: %v", err)
	}
	if _, err := cp.Front.Client.FleetV1beta1().Assignments("tenant").Create(ctx, assignment("high", "agent-1", 200), metav1.CreateOptions{}); err != nil {
		t.Errorf("priority 200 outside the capped namespace: %v", err)
	}
	// The same update through an update is denied too.
	low, err := capped.Get(ctx, "low", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	low.Spec.Priority = 101
	if _, err := capped.Update(ctx, low, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
		t.Errorf("update to priority 101 in the capped namespace: want 422 Invalid, got %v", err)
	}
}

// testPriorityAndFairness gives the user flooder a priority level of its own
// with few seats and no queue, as a cluster administrator would, and floods
// our server with flooder's lists while another user lists beside it.
func testPriorityAndFairness(t testing.TB, cp *controlPlane) {
	ctx := context.Background()
	bind(t, cp, "flood", "fleet.example.com:view", userSubject("flooder"), userSubject("bystander"))
	createMany(t, cp.Front, "flood", "f", 200)
	level, err := cp.Kube.FlowcontrolV1().PriorityLevelConfigurations().Create(ctx, &flowcontrolv1.PriorityLevelConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "flood"},
		Spec: flowcontrolv1.PriorityLevelConfigurationSpec{
			Type: flowcontrolv1.PriorityLevelEnablementLimited,
			Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{
				NominalConcurrencyShares: ptr.To(int32(1)),
				LendablePercent:          ptr.To(int32(0)),
				BorrowingLimitPercent:    ptr.To(int32(0)),
				LimitResponse:            flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeReject},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	schema, err := cp.Kube.FlowcontrolV1().FlowSchemas().Create(ctx, &flowcontrolv1.FlowSchema{
		ObjectMeta: metav1.ObjectMeta{Name: "flood"},
		Spec: flowcontrolv1.FlowSchemaSpec{
			PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: level.Name},
			MatchingPrecedence:         100,
			DistinguisherMethod:        &flowcontrolv1.FlowDistinguisherMethod{Type: flowcontrolv1.FlowDistinguisherMethodByUserType},
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects: []flowcontrolv1.Subject{{Kind: flowcontrolv1.SubjectKindUser, User: &flowcontrolv1.UserSubject{Name: "flooder"}}},
				ResourceRules: []flowcontrolv1.ResourcePolicyRule{{
					Verbs: []string{"*"}, APIGroups: []string{"*"}, Resources: []string{"*"}, Namespaces: []string{"*"},
				}},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// Straight to our server, so that the kube-apiserver's own
	// priority-and-fairness is out of the way: our server names the
	// FlowSchema it chose in a response header once its informer has it.
	flooder := cp.direct(t, "flooder", user.AllAuthenticated)
	bystander := cp.direct(t, "bystander", user.AllAuthenticated)
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, controlPlaneWait(), true, func(ctx context.Context) (bool, error) {
		return flowSchemaOf(t, flooder) == string(schema.UID), nil
	})
	if err != nil {
		t.Fatalf("our server never classified flooder's requests by the FlowSchema flood: %v", err)
	}

	var flooded, rejected, bystanderFailed, bystanderServed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := http429Client(t, flooder)
			for {
				select {
				case <-stop:
					return
				default:
				}
				flooded.Add(1)
				if code := client(); code == http.StatusTooManyRequests {
					rejected.Add(1)
				} else if code != http.StatusOK {
					t.Errorf("flooder's list: HTTP %d", code)
					return
				}
			}
		}()
	}
	bystanderList := http429Client(t, bystander)
	for range 50 {
		if code := bystanderList(); code == http.StatusOK {
			bystanderServed.Add(1)
		} else {
			bystanderFailed.Add(1)
		}
	}
	// Keep flooding until flooder has been refused, for at most 30 s.
	_ = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, controlPlaneWait(), true, func(context.Context) (bool, error) {
		return rejected.Load() > 0, nil
	})
	close(stop)
	wg.Wait()
	t.Logf("flooder: %d lists, %d refused with 429; bystander: %d served, %d failed",
		flooded.Load(), rejected.Load(), bystanderServed.Load(), bystanderFailed.Load())
	if rejected.Load() == 0 {
		t.Errorf("none of flooder's %d lists got 429", flooded.Load())
	}
	if bystanderFailed.Load() != 0 {
		t.Errorf("%d of bystander's 50 lists failed during the flood", bystanderFailed.Load())
	}
}

// flowSchemaOf returns the UID of the FlowSchema our server classified a
// request of cfg's user by.
func flowSchemaOf(t testing.TB, cfg *rest.Config) string {
	t.Helper()
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := client.Get(cfg.Host + "/apis/fleet.example.com/v1beta1/namespaces/flood/assignments?limit=1")
	if err != nil {
		return ""
	}
	res.Body.Close()
	return res.Header.Get(flowcontrolv1.ResponseHeaderMatchedFlowSchemaUID)
}

// http429Client returns a function that lists the flood namespace as cfg's
// user and returns the HTTP status.
func http429Client(t testing.TB, cfg *rest.Config) func() int {
	t.Helper()
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return func() int {
		res, err := client.Get(cfg.Host + "/apis/fleet.example.com/v1beta1/namespaces/flood/assignments")
		if err != nil {
			return 0
		}
		defer res.Body.Close()
		_, _ = io.Copy(io.Discard, res.Body)
		return res.StatusCode
	}
}

// testInformerAcrossRestart runs an informer through the kube-apiserver
// while our server restarts, and checks that it ends with every object
// seen once and a store equal to a fresh list.
func testInformerAcrossRestart(t testing.TB, cp *controlPlane) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := cp.Front.Client.FleetV1beta1().Assignments("informed")
	lw := cache.NewListWatchFromClient(cp.Front.Client.FleetV1beta1().RESTClient(), "assignments", "informed", fields.Everything())
	informer := cache.NewSharedIndexInformer(lw, &v1beta1.Assignment{}, 0, cache.Indexers{})
	var mu sync.Mutex
	added := map[string]int{}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			mu.Lock()
			defer mu.Unlock()
			added[obj.(*v1beta1.Assignment).Name]++
		},
	}); err != nil {
		t.Fatal(err)
	}
	go informer.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		t.Fatal("the informer never synced")
	}
	create := func(name string) {
		t.Helper()
		if _, err := c.Create(ctx, assignment(name, "agent-1", 0), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create("before")
	waitInStore(t, informer, "before")

	// A client listing through the kube-apiserver meanwhile may see 503
	// while nothing listens, never 403: until the server has loaded the
	// front-proxy CA it would take the aggregator's requests for
	// system:anonymous (pkg/apiserver/authentication_ready.go).
	listerDone := make(chan map[int]int)
	stopLister := make(chan struct{})
	go func() {
		codes := map[int]int{}
		defer func() { listerDone <- codes }()
		for {
			select {
			case <-stopLister:
				return
			default:
			}
			_, err := c.List(ctx, metav1.ListOptions{})
			var status apierrors.APIStatus
			switch {
			case err == nil:
				codes[http.StatusOK]++
			case errors.As(err, &status):
				codes[int(status.Status().Code)]++
			default:
				codes[0]++
			}
		}
	}()
	cp.restartServer(t)
	// Through the kube-apiserver the APIService may still be marked
	// unavailable for a moment after the restart: retry the create.
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.Create(ctx, assignment("after", "agent-1", 0), metav1.CreateOptions{})
		return err == nil || apierrors.IsAlreadyExists(err), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	waitInStore(t, informer, "after")
	close(stopLister)
	codes := <-listerDone
	t.Logf("lists through the kube-apiserver during the restart, by HTTP status: %v", codes)
	if codes[http.StatusForbidden] != 0 || codes[http.StatusUnauthorized] != 0 {
		t.Errorf("%d lists got 403 and %d got 401 around the restart", codes[http.StatusForbidden], codes[http.StatusUnauthorized])
	}

	list, err := c.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := informer.GetStore().ListKeys(); len(got) != len(list.Items) {
		t.Errorf("informer holds %v, a list returns %d items", got, len(list.Items))
	}
	mu.Lock()
	defer mu.Unlock()
	for _, name := range []string{"before", "after"} {
		if added[name] != 1 {
			t.Errorf("the informer saw %s added %d times, want once", name, added[name])
		}
	}
}

func waitInStore(t testing.TB, informer cache.SharedIndexInformer, name string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		_, ok, _ := informer.GetStore().GetByKey("informed/" + name)
		return ok, nil
	})
	if err != nil {
		t.Fatalf("the informer never saw %s", name)
	}
}

// delegatedRequests sums one of k8s.io/apiserver's delegated-authentication
// or authorization request counters. Our server runs in the test process,
// so its counters are in the process's registry.
func delegatedRequests(t testing.TB, name string) float64 {
	t.Helper()
	return metricValue(t, legacyregistry.DefaultGatherer, name, nil)
}

// tryRun runs kubectl and returns its output and error, for commands whose
// exit code is part of the answer.
func (k kubectl) tryRun(args ...string) (string, error) {
	out, err := k.command(context.Background(), args...).Output()
	return string(out), err
}

// TestControlPlaneCatchesInjectedBugs runs TestControlPlane's checks of
// authorization, admission and priority-and-fairness against our server
// misconfigured (misconfiguration), and requires each to fail, with the
// message it fails with when the server really misbehaves.
func TestControlPlaneCatchesInjectedBugs(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.v", "-test.count=1",
		"-test.run", "^TestControlPlane$/^(rbac|authentication|namespace_lifecycle|validating_admission_policy|priority_and_fairness)$")
	cmd.Env = append(os.Environ(), injectEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("TestControlPlane passed against a misconfigured server:\n%s", testkit.Tail(out, 8<<10))
	}
	for _, want := range []string{
		"--- FAIL: TestControlPlane/rbac",
		`want 403 Forbidden, got <nil>`, // viewer's create straight to our server
		"--- FAIL: TestControlPlane/authentication",
		"--- FAIL: TestControlPlane/namespace_lifecycle",
		"create in a missing namespace: want 404",
		"--- FAIL: TestControlPlane/validating_admission_policy",
		"our server never enforced the policy",
		"--- FAIL: TestControlPlane/priority_and_fairness",
		"our server never classified flooder's requests by the FlowSchema flood",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the misconfigured run's output lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("output (last 16 KiB):\n%s", testkit.Tail(out, 16<<10))
	}
}
