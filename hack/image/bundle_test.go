package main

import (
	"os"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// deployment is the project's Deployment, with its template's variables
// filled in as hack/render-manifests.sh fills them.
func deployment(t *testing.T) *appsv1.Deployment {
	t.Helper()
	data, err := os.ReadFile("../../artifacts/deploy/base/deployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	filled := os.Expand(string(data), func(v string) string {
		return map[string]string{"NAMESPACE": "fleet-system", "IMAGE": "cached-apiserver:test"}[v]
	})
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict([]byte(filled), &d); err != nil {
		t.Fatal(err)
	}
	return &d
}

// translated translates pod into a bundle under a fresh directory.
func translated(t *testing.T, pod *corev1.PodSpec) (*specs.Spec, error) {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"token", "ca.crt"} {
		if err := os.WriteFile(dir+"/"+f, []byte(f), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	secrets := map[string]*corev1.Secret{"cached-apiserver-serving-cert": {Data: map[string][]byte{"tls.crt": []byte("c"), "tls.key": []byte("k")}}}
	img := report{User: "65532:65532", Entrypoint: []string{"/cached-apiserver"}}
	k := kubelet{host: "127.0.0.1", port: "6443", token: dir + "/token", ca: dir + "/ca.crt", namespace: "fleet-system"}
	return translate(pod, img, k, dir+"/rootfs", dir, secrets)
}

// TestTranslateTheDeployment checks that the project's Deployment
// translates, and into what: its arguments after the image's entrypoint,
// its user and fsGroup, a read-only root, no capability, no privilege
// escalation, the RuntimeDefault seccomp profile, its mounts and the
// token, on the host's network.
func TestTranslateTheDeployment(t *testing.T) {
	d := deployment(t)
	spec, err := translated(t, &d.Spec.Template.Spec)
	if err != nil {
		t.Fatal(err)
	}
	p := spec.Process
	if want := append([]string{"/cached-apiserver"}, d.Spec.Template.Spec.Containers[0].Args...); !slices.Equal(p.Args, want) {
		t.Errorf("args %v, want %v", p.Args, want)
	}
	if p.User.UID != 65532 || p.User.GID != 65532 || !slices.Equal(p.User.AdditionalGids, []uint32{65532}) {
		t.Errorf("user %+v, want 65532:65532 with fsGroup 65532", p.User)
	}
	if !spec.Root.Readonly || !p.NoNewPrivileges || len(p.Capabilities.Effective)+len(p.Capabilities.Bounding)+len(p.Capabilities.Permitted) > 0 {
		t.Errorf("root read-only %v, no new privileges %v, capabilities %+v; want read-only, none and none", spec.Root.Readonly,
			p.NoNewPrivileges, p.Capabilities)
	}
	if spec.Linux.Seccomp == nil || len(spec.Linux.Seccomp.Syscalls) == 0 {
		t.Error("no RuntimeDefault seccomp profile")
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			t.Error("a network namespace: the container must share the host's")
		}
	}
	mounts := map[string]bool{}
	for _, m := range spec.Mounts {
		mounts[m.Destination] = slices.Contains(m.Options, "ro")
	}
	for dest, ro := range map[string]bool{"/var/run/serving-cert": true, "/var/lib/cached-apiserver": false, "/tmp": false,
		saPath: true} {
		if got, ok := mounts[dest]; !ok || got != ro {
			t.Errorf("mount %s: present %v, read-only %v; want present, read-only %v", dest, ok, got, ro)
		}
	}
	if !slices.Contains(p.Env, "KUBERNETES_SERVICE_HOST=127.0.0.1") || !slices.Contains(p.Env, "KUBERNETES_SERVICE_PORT=6443") {
		t.Errorf("env %v lacks the kubernetes Service's address", p.Env)
	}
}

// TestTranslateRefuses checks that what the translation does not carry is
// refused, not dropped.
func TestTranslateRefuses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*corev1.PodSpec)
		want   string
	}{
		{"hostPID", func(p *corev1.PodSpec) { p.HostPID = true }, "does not carry"},
		{"privileged", func(p *corev1.PodSpec) { p.Containers[0].SecurityContext.Privileged = ptr.To(true) }, "does not carry"},
		{"a capability added", func(p *corev1.PodSpec) {
			p.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"NET_ADMIN"}
		}, "only dropping ALL"},
		{"seccomp unconfined", func(p *corev1.PodSpec) {
			p.SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
		}, "only RuntimeDefault"},
		{"a hostPath volume", func(p *corev1.PodSpec) {
			p.Volumes = append(p.Volumes, corev1.Volume{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		}, "only secret and emptyDir"},
		{"a subPath", func(p *corev1.PodSpec) { p.Containers[0].VolumeMounts[0].SubPath = "x" }, "only name, mountPath and readOnly"},
		{"two containers", func(p *corev1.PodSpec) { p.Containers = append(p.Containers, p.Containers[0]) }, "one container"},
		{"an env", func(p *corev1.PodSpec) { p.Containers[0].Env = []corev1.EnvVar{{Name: "A", Value: "b"}} }, "does not carry"},
		{"a command", func(p *corev1.PodSpec) { p.Containers[0].Command = []string{"/bin/sh"} }, "does not carry"},
		{"root despite runAsNonRoot", func(p *corev1.PodSpec) { p.SecurityContext.RunAsUser = ptr.To(int64(0)) }, "runAsNonRoot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &deployment(t).Spec.Template.Spec
			tc.change(pod)
			_, err := translated(t, pod)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
