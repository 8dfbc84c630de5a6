package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"
)

// The one translation from a rendered Deployment's pod to an OCI bundle
// that runc runs as the kubelet would run the pod's container: its
// arguments, its security context, its volumes, and what the kubelet adds
// (the ServiceAccount's token where in-cluster config reads it, the
// kubernetes Service's address in the environment, /etc/hosts and
// /etc/resolv.conf). The container shares the host's network namespace.
// Every field of the pod it does not honour is refused, not dropped: a
// test of the image must run what the Deployment says, or fail.

// kubelet is what the kubelet and the cluster give the pod.
type kubelet struct {
	// host and port are the kubernetes Service's, token and ca the
	// ServiceAccount's, namespace the pod's.
	host, port, token, ca, namespace string
}

// saPath is where the kubelet projects the ServiceAccount's token, and
// in-cluster config reads it.
const saPath = "/var/run/secrets/kubernetes.io/serviceaccount"

func runBundle(args []string) error {
	fs := flag.NewFlagSet("bundle", flag.ContinueOnError)
	deployment := fs.String("deployment", "", "the rendered Deployment")
	secret := fs.String("secret", "", "the rendered Secret its secret volume names")
	rootfs := fs.String("rootfs", "", "the image's filesystem, unpacked")
	imageReport := fs.String("image-report", "", "image build's report: the image's user and entrypoint")
	var k kubelet
	fs.StringVar(&k.host, "kube-host", "", "KUBERNETES_SERVICE_HOST")
	fs.StringVar(&k.port, "kube-port", "", "KUBERNETES_SERVICE_PORT")
	fs.StringVar(&k.token, "token", "", "the ServiceAccount token to project")
	fs.StringVar(&k.ca, "kube-ca", "", "the cluster's CA, projected beside the token")
	out := fs.String("out", "", "the bundle's directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var d appsv1.Deployment
	var s corev1.Secret
	var r report
	for path, into := range map[string]any{*deployment: &d, *secret: &s, *imageReport: &r} {
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if err := yaml.UnmarshalStrict(data, into); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	k.namespace = d.Namespace
	spec, err := translate(&d.Spec.Template.Spec, r, k, *rootfs, *out, map[string]*corev1.Secret{s.Name: &s})
	if err != nil {
		return err
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(*out, "config.json"), data, 0o644)
}

// translate turns pod into the OCI spec of its one container, for an image
// of user and entrypoint unpacked at rootfs, preparing its volumes under
// out as the kubelet would: secrets from secrets, emptyDirs empty, both
// owned by the pod's fsGroup.
func translate(pod *corev1.PodSpec, img report, k kubelet, rootfs, out string, secrets map[string]*corev1.Secret) (*specs.Spec, error) {
	if err := refuseUnhonoured(pod); err != nil {
		return nil, err
	}
	c := pod.Containers[0]
	psc, csc := pod.SecurityContext, c.SecurityContext
	uid, gid := imageUser(img.User)
	if psc.RunAsUser != nil {
		uid = uint32(*psc.RunAsUser)
	}
	if psc.RunAsGroup != nil {
		gid = uint32(*psc.RunAsGroup)
	}
	if psc.RunAsNonRoot != nil && *psc.RunAsNonRoot && uid == 0 {
		return nil, fmt.Errorf("runAsNonRoot, but the container would run as root")
	}
	var fsGroup uint32
	if psc.FSGroup != nil {
		fsGroup = uint32(*psc.FSGroup)
	}
	spec := &specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: rootfs, Readonly: csc.ReadOnlyRootFilesystem != nil && *csc.ReadOnlyRootFilesystem},
		Process: &specs.Process{
			Args: append(slices.Clone(img.Entrypoint), c.Args...),
			Cwd:  "/",
			Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOSTNAME=" + c.Name,
				"KUBERNETES_SERVICE_HOST=" + k.host, "KUBERNETES_SERVICE_PORT=" + k.port},
			User: specs.User{UID: uid, GID: gid},
			// Dropping ALL leaves the container no capability.
			Capabilities:    &specs.LinuxCapabilities{},
			NoNewPrivileges: csc.AllowPrivilegeEscalation != nil && !*csc.AllowPrivilegeEscalation,
		},
		Hostname: c.Name,
		Mounts:   defaultMounts(),
		Linux: &specs.Linux{
			// The pod's own namespaces but the network: the host's, and so
			// its loopback.
			Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace}},
			Resources:     resources(c.Resources),
			MaskedPaths:   []string{"/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"},
			ReadonlyPaths: []string{"/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
		Annotations: map[string]string{"io.kubernetes.pod.terminationGracePeriod": strconv.FormatInt(grace(pod), 10)},
	}
	if psc.FSGroup != nil {
		spec.Process.User.AdditionalGids = []uint32{fsGroup}
	}
	if sp := psc.SeccompProfile; sp != nil {
		profile, err := seccomp.GetDefaultProfile(spec)
		if err != nil {
			return nil, fmt.Errorf("the RuntimeDefault seccomp profile: %w", err)
		}
		spec.Linux.Seccomp = profile
	}
	volumes := map[string]string{}
	for _, v := range pod.Volumes {
		dir, err := prepareVolume(v, out, fsGroup, secrets)
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", v.Name, err)
		}
		volumes[v.Name] = dir
	}
	for _, m := range c.VolumeMounts {
		dir, ok := volumes[m.Name]
		if !ok {
			return nil, fmt.Errorf("volumeMount %s names no volume", m.Name)
		}
		spec.Mounts = append(spec.Mounts, bind(dir, m.MountPath, m.ReadOnly))
	}
	if pod.ServiceAccountName != "" {
		dir, err := projectToken(k, out, fsGroup)
		if err != nil {
			return nil, err
		}
		spec.Mounts = append(spec.Mounts, bind(dir, saPath, true))
	}
	// What the runtime gives every container.
	spec.Mounts = append(spec.Mounts, bind("/etc/hosts", "/etc/hosts", true), bind("/etc/resolv.conf", "/etc/resolv.conf", true))
	return spec, nil
}

// refuseUnhonoured refuses a pod with anything translate does not carry
// into the container, by comparing it, with what translate reads cleared,
// with the empty pod.
func refuseUnhonoured(pod *corev1.PodSpec) error {
	if len(pod.Containers) != 1 || len(pod.InitContainers) > 0 || len(pod.EphemeralContainers) > 0 {
		return fmt.Errorf("one container, and no init or ephemeral containers, is all the translation runs")
	}
	if pod.SecurityContext == nil || pod.Containers[0].SecurityContext == nil {
		return fmt.Errorf("the pod and its container must have a securityContext")
	}
	p := pod.DeepCopy()
	psc, c := p.SecurityContext, &p.Containers[0]
	csc := c.SecurityContext
	if sp := psc.SeccompProfile; sp != nil && sp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		return fmt.Errorf("seccompProfile %s: only RuntimeDefault is translated", sp.Type)
	}
	if caps := csc.Capabilities; caps != nil && (len(caps.Add) > 0 || !slices.Equal(caps.Drop, []corev1.Capability{"ALL"})) {
		return fmt.Errorf("capabilities %v: only dropping ALL is translated", caps)
	}
	for _, v := range p.Volumes {
		if v.Secret == nil && v.EmptyDir == nil {
			return fmt.Errorf("volume %s: only secret and emptyDir volumes are translated", v.Name)
		}
		if v.EmptyDir != nil && (v.EmptyDir.Medium != "" || v.EmptyDir.SizeLimit != nil) {
			return fmt.Errorf("volume %s: only a plain emptyDir is translated", v.Name)
		}
	}
	for _, m := range c.VolumeMounts {
		if m.SubPath != "" || m.SubPathExpr != "" || m.MountPropagation != nil || m.RecursiveReadOnly != nil {
			return fmt.Errorf("volumeMount %s: only name, mountPath and readOnly are translated", m.Name)
		}
	}
	// What translate reads, cleared; what is left must be nothing.
	psc.RunAsUser, psc.RunAsGroup, psc.RunAsNonRoot, psc.FSGroup, psc.SeccompProfile = nil, nil, nil, nil, nil
	csc.AllowPrivilegeEscalation, csc.ReadOnlyRootFilesystem, csc.Capabilities = nil, nil, nil
	c.Name, c.Image, c.Args, c.VolumeMounts, c.Resources = "", "", nil, nil, corev1.ResourceRequirements{}
	// Probes and ports are the test's to use: it reads /readyz over the
	// host's network, which ports only name.
	c.ReadinessProbe, c.LivenessProbe, c.Ports = nil, nil, nil
	p.Volumes, p.ServiceAccountName, p.TerminationGracePeriodSeconds = nil, "", nil
	if !equality.Semantic.DeepEqual(*psc, corev1.PodSecurityContext{}) || !equality.Semantic.DeepEqual(*csc, corev1.SecurityContext{}) {
		return fmt.Errorf("the securityContext has fields the translation does not carry: %+v %+v", *psc, *csc)
	}
	p.SecurityContext, c.SecurityContext = nil, nil
	if !equality.Semantic.DeepEqual(*c, corev1.Container{}) {
		return fmt.Errorf("the container has fields the translation does not carry: %+v", *c)
	}
	p.Containers = nil
	if !equality.Semantic.DeepEqual(*p, corev1.PodSpec{}) {
		return fmt.Errorf("the pod has fields the translation does not carry: %+v", *p)
	}
	return nil
}

// imageUser reads an image's USER, uid:gid in numbers.
func imageUser(user string) (uid, gid uint32) {
	u, g, _ := strings.Cut(user, ":")
	uidN, _ := strconv.ParseUint(u, 10, 32)
	gidN, _ := strconv.ParseUint(g, 10, 32)
	return uint32(uidN), uint32(gidN)
}

// grace is the pod's termination grace period, in seconds.
func grace(pod *corev1.PodSpec) int64 {
	if pod.TerminationGracePeriodSeconds != nil {
		return *pod.TerminationGracePeriodSeconds
	}
	return corev1.DefaultTerminationGracePeriodSeconds
}

// resources turns a container's memory limit and CPU request into cgroup
// settings, as the kubelet does: the limit a hard one, the request CPU
// shares.
func resources(r corev1.ResourceRequirements) *specs.LinuxResources {
	res := &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}}
	if q, ok := r.Limits[corev1.ResourceMemory]; ok {
		limit := q.Value()
		res.Memory = &specs.LinuxMemory{Limit: &limit}
	}
	if q, ok := r.Requests[corev1.ResourceCPU]; ok {
		shares := uint64(max(2, q.MilliValue()*1024/1000))
		res.CPU = &specs.LinuxCPU{Shares: &shares}
	}
	return res
}

// prepareVolume makes a volume's directory under out as the kubelet would:
// a secret's keys as files of its defaultMode, an emptyDir empty, both
// owned by the pod's fsGroup.
func prepareVolume(v corev1.Volume, out string, fsGroup uint32, secrets map[string]*corev1.Secret) (string, error) {
	dir := filepath.Join(out, "volumes", v.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	switch {
	case v.Secret != nil:
		s, ok := secrets[v.Secret.SecretName]
		if !ok {
			return "", fmt.Errorf("secret %s was not given", v.Secret.SecretName)
		}
		mode := os.FileMode(corev1.SecretVolumeSourceDefaultMode)
		if v.Secret.DefaultMode != nil {
			mode = os.FileMode(*v.Secret.DefaultMode)
		}
		files := map[string][]byte{}
		for key, value := range s.Data {
			files[key] = value
		}
		for key, value := range s.StringData {
			files[key] = []byte(value)
		}
		for key, value := range files {
			if err := writeOwned(filepath.Join(dir, key), value, mode, fsGroup); err != nil {
				return "", err
			}
		}
		return dir, ownGroup(dir, 0o755, fsGroup)
	default:
		// The kubelet's emptyDir: everyone's, group the fsGroup's, setgid.
		return dir, ownGroup(dir, 0o777|os.ModeSetgid, fsGroup)
	}
}

// projectToken writes what the kubelet projects for the ServiceAccount.
func projectToken(k kubelet, out string, fsGroup uint32) (string, error) {
	dir := filepath.Join(out, "volumes", "kube-api-access")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	token, err := os.ReadFile(k.token)
	if err != nil {
		return "", err
	}
	ca, err := os.ReadFile(k.ca)
	if err != nil {
		return "", err
	}
	for name, data := range map[string][]byte{"token": token, "ca.crt": ca, "namespace": []byte(k.namespace)} {
		if err := writeOwned(filepath.Join(dir, name), data, 0o644, fsGroup); err != nil {
			return "", err
		}
	}
	return dir, ownGroup(dir, 0o755, fsGroup)
}

// writeOwned writes a file of mode, group fsGroup and readable by it, as
// the kubelet applies fsGroup.
func writeOwned(path string, data []byte, mode os.FileMode, fsGroup uint32) error {
	if err := os.WriteFile(path, data, mode); err != nil {
		return err
	}
	return ownGroup(path, mode|0o040, fsGroup)
}

func ownGroup(path string, mode os.FileMode, fsGroup uint32) error {
	if err := os.Chown(path, 0, int(fsGroup)); err != nil {
		return err
	}
	return os.Chmod(path, mode)
}

// bind is a bind mount of source at destination.
func bind(source, destination string, readOnly bool) specs.Mount {
	opts := []string{"rbind", "rprivate"}
	if readOnly {
		opts = append(opts, "ro")
	}
	return specs.Mount{Destination: destination, Type: "bind", Source: source, Options: opts}
}

// defaultMounts are the filesystems every container has, as runc's own
// spec gives them.
func defaultMounts() []specs.Mount {
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
	}
}
