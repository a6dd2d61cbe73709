package kubenode

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/kubebox"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// BoxNamePrefix starts the name of every box that runs a pod: the box is
// named BoxNamePrefix + the pod's UID, so that a restarted node finds the
// boxes of its pods (and removes those whose pod is gone).
const BoxNamePrefix = kubebox.BoxNamePrefix

// BoxName is the name of the box that runs the pod with this UID.
func BoxName(uid types.UID) string { return kubebox.BoxName(string(uid)) }

// apiBox says whether the pod is a box made through airlock's API (by
// airlock gateway: it carries kubebox.OptionsAnnotation): no main command
// runs in it, and it runs until the pod is deleted or the box stops.
func apiBox(pod *corev1.Pod) bool {
	_, ok := pod.Annotations[kubebox.OptionsAnnotation]
	return ok
}

// Status reasons of pods this node refuses or fails (pod.status.reason, and
// the terminated container's reason where it has one).
const (
	// ReasonUnsupported: the pod asks for something airlock does not do
	// (yet): more than one container, init containers, volumes other
	// than emptyDir, ConfigMap, Secret and projected ones.
	// status.message says which.
	ReasonUnsupported = "UnsupportedPodSpec"
	// ReasonStartError: the box could not be created or started, or the
	// command could not be run (status.message carries the error).
	ReasonStartError = "StartError"
	// ReasonBoxDied: the box's VM ended under a running container.
	ReasonBoxDied = "BoxDied"
)

// serviceAccountVolumePrefix names the projected volume that the API
// server's ServiceAccount admission adds to every pod (the API token). It
// is not mounted in the box yet; refusing it would refuse every pod.
// Other volumes: see volumes.go.
const serviceAccountVolumePrefix = "kube-api-access-"

// checkPod returns why the pod cannot run as a box ("" when it can). A pod
// this node cannot honour fails with that message rather than running as
// a different pod than asked.
func checkPod(pod *corev1.Pod) string {
	s := &pod.Spec
	var why []string
	if n := len(s.Containers); n != 1 {
		why = append(why, fmt.Sprintf("the pod has %d containers; an airlock box runs exactly one", n))
	}
	if len(s.InitContainers) > 0 {
		why = append(why, "init containers are not supported")
	}
	if len(s.EphemeralContainers) > 0 {
		why = append(why, "ephemeral containers are not supported")
	}
	why = append(why, checkVolumes(s)...)
	if s.HostNetwork || s.HostPID || s.HostIPC {
		why = append(why, "host namespaces (hostNetwork, hostPID, hostIPC) are not available to a box")
	}
	for _, c := range s.Containers {
		if c.Stdin || c.TTY {
			why = append(why, fmt.Sprintf("container %s: stdin and tty are not supported yet", c.Name))
		}
	}
	return strings.Join(why, "; ")
}

// checkEnvRefs returns why the pod's env and volumes cannot be made
// without the API ("" when they can): valueFrom, envFrom and configMap,
// secret and projected volumes need it (Provider.SetAPI).
func checkEnvRefs(pod *corev1.Pod) string {
	var why []string
	for _, c := range pod.Spec.Containers {
		for _, e := range c.Env {
			if e.ValueFrom != nil {
				why = append(why, fmt.Sprintf("container %s: env %s: valueFrom needs the node's API client", c.Name, e.Name))
			}
		}
		if len(c.EnvFrom) > 0 {
			why = append(why, fmt.Sprintf("container %s: envFrom needs the node's API client", c.Name))
		}
	}
	for _, v := range pod.Spec.Volumes {
		if (v.ConfigMap != nil || v.Secret != nil || v.Projected != nil) && !strings.HasPrefix(v.Name, serviceAccountVolumePrefix) {
			why = append(why, fmt.Sprintf("volume %s: configMap, secret and projected volumes need the node's API client", v.Name))
		}
	}
	return strings.Join(why, "; ")
}

// boxOptions maps the pod's one container to the options of its box:
// image, env (plain values), workingDir, runAsUser, and resources.limits
// (cpu rounded up to whole vCPUs, memory in MiB rounded up; without limits
// the box has airlock's defaults).
func boxOptions(pod *corev1.Pod) (airlock.BoxOptions, error) {
	c := &pod.Spec.Containers[0]
	opts := airlock.BoxOptions{
		Image:      c.Image,
		Name:       BoxName(pod.UID),
		WorkingDir: c.WorkingDir,
		Network:    airlock.NetworkPublic,
	}
	for _, e := range c.Env {
		opts.Env = append(opts.Env, e.Name+"="+e.Value)
	}
	if cpu, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
		milli := cpu.MilliValue()
		opts.CPUs = int((milli + 999) / 1000)
		if opts.CPUs > airlock.MaxCPUs {
			return opts, fmt.Errorf("resources.limits.cpu %s is more than a box may have (%d)", cpu.String(), airlock.MaxCPUs)
		}
	}
	if mem, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		mib := (mem.Value() + (1<<20 - 1)) >> 20
		if mib < airlock.MinMemoryMiB {
			return opts, fmt.Errorf("resources.limits.memory %s is less than a box needs (%d Mi)", mem.String(), airlock.MinMemoryMiB)
		}
		opts.MemoryMiB = int(mib)
	}
	if sc := c.SecurityContext; sc != nil && sc.RunAsUser != nil {
		opts.User = strconv.FormatInt(*sc.RunAsUser, 10)
		if sc.RunAsGroup != nil {
			opts.User += ":" + strconv.FormatInt(*sc.RunAsGroup, 10)
		}
	} else if psc := pod.Spec.SecurityContext; psc != nil && psc.RunAsUser != nil {
		opts.User = strconv.FormatInt(*psc.RunAsUser, 10)
		if psc.RunAsGroup != nil {
			opts.User += ":" + strconv.FormatInt(*psc.RunAsGroup, 10)
		}
	}
	if h := pod.Spec.Hostname; h != "" {
		opts.Hostname = h
	}
	if a, ok := pod.Annotations[kubebox.OptionsAnnotation]; ok {
		o, err := kubebox.ParseOptions(a)
		if err != nil {
			return opts, err
		}
		if o.Network != "" {
			opts.Network = airlock.NetworkMode(o.Network)
		}
		opts.AllowNet, opts.DiskSizeMiB = o.AllowNet, o.DiskSizeMiB
		if o.User != "" {
			opts.User = o.User
		}
		sec := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
		opts.TTL, opts.IdleTimeout, opts.Lease = sec(o.TTL), sec(o.IdleTimeout), sec(o.Lease)
		opts.IdleAction = airlock.IdleAction(o.IdleAction)
		opts.AllowHostPorts = o.AllowHostPorts
		// The pod's labels (the gateway's box id, name and tenant among
		// them) go with the box, and so with its snapshots: a gateway
		// names a snapshot's box from them once the box is gone.
		for k, v := range pod.Labels {
			if len(opts.Labels) < 64 && len(k) <= 128 {
				if opts.Labels == nil {
					opts.Labels = map[string]string{}
				}
				opts.Labels[k] = v
			}
		}
		for _, pm := range o.Ports {
			opts.Ports = append(opts.Ports, airlock.PortMapping{HostIP: pm.HostIP, HostPort: pm.HostPort, GuestPort: pm.GuestPort, Protocol: pm.Protocol})
		}
		for _, v := range o.Volumes {
			opts.Volumes = append(opts.Volumes, airlock.Volume{Source: v.Source, Target: v.Target, ReadOnly: v.ReadOnly})
		}
		if o.FromSnapshot != "" {
			// The snapshot's machine and network are its own (the pod's
			// resources were made from them by the gateway).
			opts.FromSnapshot = o.FromSnapshot
			opts.Network, opts.DiskSizeMiB = airlock.NetworkMode(o.Network), 0
		}
	}
	return opts, nil
}

// boxSecrets reads the values of the secrets of a pod made through the
// API (kubebox.Options.Secrets) from their Secret (SecretsFrom, in the
// pod's namespace): nil without secrets; an error while the Secret or a
// key is missing (the pod waits in CreateContainerConfigError).
func boxSecrets(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod) (map[string]airlock.Secret, error) {
	a, ok := pod.Annotations[kubebox.OptionsAnnotation]
	if !ok {
		return nil, nil
	}
	o, err := kubebox.ParseOptions(a)
	if err != nil || len(o.Secrets) == 0 {
		return nil, nil // a bad annotation fails in boxOptions
	}
	if client == nil {
		return nil, fmt.Errorf("the box's secrets are in Secret %s, and this node has no API client to read it", o.SecretsFrom)
	}
	sec, err := client.CoreV1().Secrets(pod.Namespace).Get(ctx, o.SecretsFrom, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("secret %q (the box's secrets): %v", o.SecretsFrom, err)
	}
	out := make(map[string]airlock.Secret, len(o.Secrets))
	for name, h := range o.Secrets {
		v, ok := sec.Data[name]
		if !ok {
			return nil, fmt.Errorf("secret %q has no key %q (the box's secret %s)", o.SecretsFrom, name, name)
		}
		out[name] = airlock.Secret{Value: string(v), Hosts: h.Hosts}
	}
	return out, nil
}

// command returns the argv the container runs, as Kubernetes defines it
// from the container's command and args and the image's entrypoint and
// cmd: command replaces the entrypoint (and drops cmd); args alone
// replace cmd. $(VAR) references to the container's env are expanded as
// the kubelet does ($$ escapes a $).
func command(c *corev1.Container, entrypoint, cmd []string) ([]string, error) {
	var argv []string
	switch {
	case len(c.Command) > 0:
		argv = append(append(argv, c.Command...), c.Args...)
	case len(c.Args) > 0:
		argv = append(append(argv, entrypoint...), c.Args...)
	default:
		argv = append(append(argv, entrypoint...), cmd...)
	}
	if len(argv) == 0 {
		return nil, fmt.Errorf("no command: the container sets none and image %s has no entrypoint or cmd", c.Image)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	for i, a := range argv {
		argv[i] = expand(a, env)
	}
	return argv, nil
}

// expand replaces $(NAME) with env's value when NAME is defined, leaves it
// as written otherwise, and turns $$ into $ (Kubernetes' rules for command
// and args).
func expand(s string, env map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteByte(s[i])
				continue
			}
			name := s[i+2 : i+2+end]
			if v, ok := env[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

// checkHostVolumes resolves the host directory volumes of opts (symlinks
// followed) and refuses those not under a directory of allow (airlock
// node --allow-volume): a pod's annotation must not open the node's
// filesystem beyond what its operator grants.
func checkHostVolumes(opts *airlock.BoxOptions, allow []string) error {
	for i, v := range opts.Volumes {
		if !v.IsHostDir() {
			continue
		}
		if len(allow) == 0 {
			return fmt.Errorf("host volume %s: this node grants no host directories (start it with airlock node --allow-volume DIR)", v.Source)
		}
		real, err := filepath.EvalSymlinks(filepath.Clean(v.Source))
		if err != nil {
			return fmt.Errorf("host volume %s: cannot resolve it on node's host (%v): give an existing directory under %s (airlock node --allow-volume)", v.Source, err, strings.Join(allow, ", "))
		}
		ok := false
		for _, d := range allow {
			if rd, err := filepath.EvalSymlinks(d); err == nil {
				d = rd
			}
			if rel, err := filepath.Rel(d, real); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
				ok = true
				break
			}
		}
		if !ok {
			return fmt.Errorf("host volume %s is not under a directory this node grants (%s; airlock node --allow-volume)", v.Source, strings.Join(allow, ", "))
		}
		opts.Volumes[i].Source = real
	}
	return nil
}
