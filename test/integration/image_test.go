package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
)

// The image users deploy, run as the Deployment runs it. make image
// (hack/build-image.sh) builds it from the Dockerfile without a container
// engine, through a registry and back by digest; its filesystem is the root
// of an OCI bundle whose config is hack/image's one translation of the
// rendered Deployment's pod (hack/image/bundle.go), and runc, from Debian's
// packages (hack/install-runc.sh), runs it, behind the control plane's
// kube-apiserver and aggregator.

// imageFiles are every file the image holds, and what each is for: a file
// missing, or one more, fails the test.
var imageFiles = map[string]string{
	"/cached-apiserver": "the server, a static binary",
	"/etc/passwd":       "the nonroot user, 65532, for tools that look its name up",
	"/etc/group":        "its group",
}

// imageUID is the user the Deployment runs the image as.
const imageUID = 65532

// imageReport is what hack/build-image.sh writes of the image (bin/image.json).
type imageReport struct {
	Reference string `json:"reference"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
	Files     []struct {
		Path string `json:"path"`
		Size int64  `json:"size"`
	} `json:"files"`
}

// builtImage builds the image once per test process and returns its
// report, with its size and files checked against imageFiles.
func builtImage(t testing.TB) (imageReport, string) {
	t.Helper()
	path := testkit.BuildTool(t, "build-image.sh", "image.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r imageReport
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	var paths []string
	var binary int64
	for _, f := range r.Files {
		paths = append(paths, f.Path)
		if f.Path == "/cached-apiserver" {
			binary = f.Size
		}
	}
	want := slices.Sorted(func(yield func(string) bool) {
		for p := range imageFiles {
			if !yield(p) {
				return
			}
		}
	})
	slices.Sort(paths)
	if !slices.Equal(paths, want) {
		t.Errorf("the image holds %v, want exactly %v", paths, want)
	}
	t.Logf("image %s (%s): %.1f MiB uncompressed, the binary %.1f MiB; files %v", r.Reference, r.Digest,
		float64(r.Size)/(1<<20), float64(binary)/(1<<20), paths)
	if r.Size > binary+1<<20 {
		t.Errorf("the image is %d bytes uncompressed, more than the binary's %d plus 1 MiB", r.Size, binary)
	}
	return r, filepath.Join(filepath.Dir(path), "image-rootfs")
}

// inRunc runs the image under runc as the rendered Deployment says, on the
// port its arguments name.
type inRunc struct {
	rootfs string
}

// deployedPort is the port the Deployment's --secure-port names.
const deployedPort = 8443

func (inRunc) listen(t testing.TB) (string, net.Listener) {
	t.Helper()
	// The container serves on the host's network: the port must be free.
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", deployedPort))
	if err != nil {
		t.Fatalf("the Deployment's port %d is taken: %v", deployedPort, err)
	}
	ln.Close()
	return ln.Addr().String(), nil
}

func (r inRunc) start(t testing.TB, cp *controlPlane, manifests string, _ net.Listener) {
	t.Helper()
	c, err := runDeployed(t, cp, r.rootfs, nil)
	if err != nil {
		t.Fatal(err)
	}
	cp.stopServer = c.stop
}

// container is one run of the image.
type container struct {
	proc *testkit.Process
	stop func()
}

// containers numbers the containers a test process runs.
var containers atomic.Int64

// runDeployed runs the image under runc as the Deployment in the rendered
// manifests says, changed by change if set, and returns once it serves
// /readyz. It fails, returning why, if the translation refuses the pod,
// the container exits, its process is not the Deployment's user, its root
// filesystem is writable, or it is not ready within two minutes.
func runDeployed(t testing.TB, cp *controlPlane, rootfs string, change func(*appsv1.Deployment)) (*container, error) {
	t.Helper()
	dir := t.TempDir()
	var d appsv1.Deployment
	readManifest(t, filepath.Join(cp.manifests, "deployment.yaml"), &d)
	if change != nil {
		change(&d)
	}
	writeYAML(t, filepath.Join(dir, "deployment.yaml"), &d)
	token, err := cp.Kube.CoreV1().ServiceAccounts(deployNamespace).CreateToken(context.Background(), d.Spec.Template.Spec.ServiceAccountName,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "token"), []byte(token.Status.Token))
	_, kasPort, err := net.SplitHostPort(strings.TrimPrefix(cp.kasURL, "https://"))
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(dir, "bundle")
	translate := exec.Command("go", "run", ".", "bundle", "-deployment", filepath.Join(dir, "deployment.yaml"),
		"-secret", filepath.Join(cp.manifests, "secret-serving-cert.yaml"), "-rootfs", rootfs,
		"-image-report", filepath.Join(root, "bin", "image.json"), "-kube-host", "127.0.0.1", "-kube-port", kasPort,
		"-token", filepath.Join(dir, "token"), "-kube-ca", cp.kasCA, "-out", bundle)
	translate.Dir = filepath.Join(root, "hack", "image")
	if out, err := translate.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("translating the pod: %v\n%s", err, out)
	}
	runc, err := exec.LookPath("runc")
	if err != nil {
		t.Fatalf("runc is missing: make runc installs it (%v)", err)
	}
	state := filepath.Join(dir, "runc")
	id := fmt.Sprintf("cached-apiserver-%d-%d", os.Getpid(), containers.Add(1))
	proc := testkit.StartProcess(t, testkit.ProcessConfig{Name: id, Bin: runc, LogPath: filepath.Join(dir, "container.log"),
		Grace: time.Duration(gracePeriod(t, bundle)) * time.Second, Args: []string{"--root", state, "run", "--bundle", bundle, id}})
	c := &container{proc: proc, stop: func() {
		_ = proc.Terminate(time.Duration(gracePeriod(t, bundle)) * time.Second)
		_ = exec.Command(runc, "--root", state, "delete", "--force", id).Run()
	}}
	t.Cleanup(c.stop)
	readyz, err := rest.HTTPClientFor(cp.direct(t, user.SystemPrivilegedGroup, user.SystemPrivilegedGroup))
	if err != nil {
		t.Fatal(err)
	}
	checked := false
	err = wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if !proc.Running() {
			return false, fmt.Errorf("the container exited: %s", proc.LogTail(2000))
		}
		if !checked {
			pid, err := containerPID(runc, state, id)
			if err != nil || pid == 0 {
				return false, nil // not started yet
			}
			if err := checkProcess(pid); err != nil {
				return false, err
			}
			t.Logf("container %s: process %d checked", id, pid)
			checked = true
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, cp.Backend+"/readyz", nil)
		if err != nil {
			return false, err
		}
		resp, err := readyz.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

// gracePeriod is the pod's termination grace period, as the bundle
// records it.
func gracePeriod(t testing.TB, bundle string) int {
	t.Helper()
	var cfg struct {
		Annotations map[string]string `json:"annotations"`
	}
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(cfg.Annotations["io.kubernetes.pod.terminationGracePeriod"])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// containerPID is the pid of the container's process, 0 before it starts.
func containerPID(runc, state, id string) (int, error) {
	out, err := exec.Command(runc, "--root", state, "state", id).Output()
	if err != nil {
		return 0, err
	}
	var st struct {
		Pid    int    `json:"pid"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return 0, err
	}
	if st.Status != "running" {
		return 0, nil
	}
	return st.Pid, nil
}

// checkProcess checks the container's process as the kernel sees it: the
// Deployment's user and group, no capability, no privilege escalation, a
// seccomp filter (RuntimeDefault), and a read-only root filesystem.
func checkProcess(pid int) error {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return err
	}
	want := map[string]string{"Uid": strconv.Itoa(imageUID), "Gid": strconv.Itoa(imageUID), "CapEff": "0000000000000000",
		"CapPrm": "0000000000000000", "CapBnd": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"}
	seen := 0
	for _, line := range strings.Split(string(status), "\n") {
		key, values, ok := strings.Cut(line, ":")
		if !ok || want[key] == "" {
			continue
		}
		seen++
		for _, v := range strings.Fields(values) {
			if v != want[key] {
				return fmt.Errorf("the container runs with %s %s, want %s", key, strings.TrimSpace(values), want[key])
			}
		}
	}
	if seen != len(want) {
		return fmt.Errorf("/proc/%d/status lacks some of %v", pid, want)
	}
	mounts, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && f[4] == "/" {
			if !slices.Contains(strings.Split(f[5], ","), "ro") {
				return fmt.Errorf("the container's root filesystem is writable: %s", line)
			}
			return nil
		}
	}
	return errors.New("the container has no root filesystem in its mountinfo")
}

// TestImageRunsAsDeployed runs the image under runc exactly as the rendered
// Deployment says: its arguments, its user, its read-only root, its
// mounts, no capabilities, no privilege escalation, RuntimeDefault seccomp,
// and what the kubelet adds (the ServiceAccount's token, the kubernetes
// Service's address). The kube-apiserver's aggregator then serves kubectl
// from it, as TestKubectl's aggregated variant does from the bare binary.
// The translation refuses a pod with anything it does not carry, and the
// three ways a deployment of it can go wrong are shown to fail.
func TestImageRunsAsDeployed(t *testing.T) {
	_, rootfs := builtImage(t)
	cp := startControlPlaneWith(t, inRunc{rootfs: rootfs}, "chunks", "watched")
	t.Run("kubectl through the aggregator", func(t *testing.T) { testKubectl(t, cp.Front) })

	// What must fail, each with the cause it must name. The container the
	// control plane runs is stopped first: they share its port.
	cp.stopServer()
	for _, tc := range []struct {
		name   string
		change func(*appsv1.Deployment)
		want   string
	}{
		{name: "a write outside the mounts", want: "read-only file system", change: func(d *appsv1.Deployment) {
			c := &d.Spec.Template.Spec.Containers[0]
			c.Args = append(c.Args, "--data-dir=/var/lib/elsewhere")
		}},
		{name: "a missing mount", want: "read-only file system", change: func(d *appsv1.Deployment) {
			c := &d.Spec.Template.Spec.Containers[0]
			c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "data" })
		}},
		{name: "a wrong user", want: "runs with Uid 1000", change: func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.SecurityContext.RunAsUser = ptr.To(int64(1000))
		}},
		{name: "a field the translation does not carry", want: "does not carry", change: func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.HostPID = true
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := runDeployed(t, cp, rootfs, tc.change)
			if err == nil {
				c.stop()
				t.Fatalf("the image ran and served with %s", tc.name)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("it failed, but not for %q: %v", tc.want, err)
			}
			t.Logf("failed as it must: %.300s", err)
		})
	}
}
