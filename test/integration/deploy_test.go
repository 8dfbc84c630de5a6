package integration

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"go.etcd.io/etcd/server/v3/embed"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/cached-apiserver/cached-apiserver/pkg/cmd/server"
)

// testDeployVariants applies both kustomizations of artifacts/deploy
// (base, the trial, and ha) with kubectl apply -k into a namespace of its
// own, labelled by the manifests themselves to enforce the restricted Pod
// Security Standard and warn at apply of any pod template that breaks it.
// The apply must print no warning and report every object it renders.
//
// No kubelet runs, so no pod starts: what is proved is that the cluster
// takes every object, and that every pod template passes restricted. The
// apply is a server-side dry run after the namespace itself is created:
// the variants' APIServices and ClusterRoles are cluster-wide, and a real
// apply would repoint the control plane's fleet.example.com at a service
// with no pods. Admission, PodSecurity included, runs on a dry run.
//
// It also parses the ha Deployment's arguments with our server's flags,
// and the etcd StatefulSet's with etcd's, so that a typo in either fails
// here and not in a cluster.
func testDeployVariants(t *testing.T, cp *controlPlane) {
	k := newKubectl(t, cp.Front)
	for _, variant := range []string{"base", "ha"} {
		t.Run(variant, func(t *testing.T) {
			ns := "deploy-" + variant
			dir := filepath.Dir(renderManifestsIn(t, filepath.Join(t.TempDir(), "manifests"), ns))
			k.run(t, "apply", "-f", filepath.Join(dir, "base", "00-namespace.yaml"))

			rendered := kustomized(t, k, filepath.Join(dir, variant))
			cmd := k.command(context.Background(), "apply", "-k", filepath.Join(dir, variant), "--dry-run=server")
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("kubectl apply -k %s: %v\n%s%s", variant, err, stdout.String(), stderr.String())
			}
			if strings.Contains(strings.ToLower(stderr.String()+stdout.String()), "warning") {
				t.Errorf("kubectl apply -k %s warned:\n%s%s", variant, stderr.String(), stdout.String())
			}
			for _, obj := range rendered {
				// kubectl names an object as resource.group/name, and says
				// created, or configured/unchanged for the cluster-wide ones
				// the control plane's own deployment holds already.
				name := regexp.QuoteMeta("/" + obj.GetName())
				line := regexp.MustCompile(`(?m)^[a-z0-9.]+` + name + ` (created|configured|unchanged) \(server dry run\)$`)
				m := line.FindStringSubmatch(stdout.String())
				switch {
				case m == nil:
					t.Errorf("%s %s/%s: not applied:\n%s", obj.GetKind(), obj.GetNamespace(), obj.GetName(), stdout.String())
				case obj.GetNamespace() == ns && m[1] != "created":
					t.Errorf("%s %s/%s is %s, want created", obj.GetKind(), ns, obj.GetName(), m[1])
				}
			}
			if variant == "ha" {
				checkHAArguments(t, rendered)
			}
		})
	}
}

// kustomized returns the objects kubectl kustomize renders from dir.
func kustomized(t testing.TB, k kubectl, dir string) []*unstructured.Unstructured {
	t.Helper()
	out := k.run(t, "kustomize", dir)
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(out), 4096)
	var objs []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("kubectl kustomize %s: %v", dir, err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// checkHAArguments parses the ha variant's server and etcd arguments as
// each program does.
func checkHAArguments(t testing.TB, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, obj := range objs {
		switch obj.GetKind() {
		case "Deployment":
			var d appsv1.Deployment
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &d); err != nil {
				t.Fatal(err)
			}
			opts := server.NewOptions(io.Discard)
			fs := pflag.NewFlagSet("cached-apiserver", pflag.ContinueOnError)
			opts.AddFlags(fs)
			if err := fs.Parse(d.Spec.Template.Spec.Containers[0].Args); err != nil {
				t.Errorf("the ha Deployment's arguments: %v", err)
			}
			if err := opts.Validate(); err != nil {
				t.Errorf("the ha Deployment's arguments do not validate: %v", err)
			}
			if got := *d.Spec.Replicas; got != 3 {
				t.Errorf("the ha Deployment runs %d replicas, want 3", got)
			}
		case "StatefulSet":
			var s appsv1.StatefulSet
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &s); err != nil {
				t.Fatal(err)
			}
			fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			embed.NewConfig().AddFlags(fs)
			// The etcd command adds these few to embed's flags.
			for _, name := range []string{"initial-cluster-state", "discovery-fallback", "v2-deprecation"} {
				fs.String(name, "", "")
			}
			var args []string
			for _, a := range s.Spec.Template.Spec.Containers[0].Args {
				args = append(args, strings.ReplaceAll(a, "$(POD_NAME)", "etcd-0"))
			}
			if err := fs.Parse(args); err != nil {
				t.Errorf("the etcd StatefulSet's arguments: %v", err)
			}
			if fs.NArg() > 0 {
				t.Errorf("the etcd StatefulSet passes stray arguments %v", fs.Args())
			}
		}
	}
}
