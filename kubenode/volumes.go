package kubenode

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/airlock-run/airlock"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
)

// A pod's volumes are written into its box before its command first runs
// (a box shares no file system with the host that a mount could use):
//
//   - emptyDir: a directory of the box (mode 0777, as a kubelet makes
//     it), kept across the container's restarts (a restart is a new boot
//     of the same box) and gone with the pod;
//   - configMap, secret and projected (of configMaps and secrets): their
//     keys as files at the mount path (items, defaultMode and mode, and
//     optional, as Kubernetes defines them; the pod's fsGroup owns them).
//     They are written at start and kept in step with the ConfigMap or
//     Secret while the pod runs (syncVolumes, every volumeSyncInterval,
//     as a kubelet's sync updates them); readOnly is not enforced.
//
// The service-account token volume that admission adds to every pod
// (serviceAccountVolumePrefix) is not mounted.

// maxVolumeBytes bounds the bytes a pod's ConfigMap and Secret volumes
// write into its box (each object holds up to 1 MiB; a pod may name
// many).
const maxVolumeBytes = 16 << 20

// volumeFile is a file or directory that a volume puts into the box.
type volumeFile struct {
	path string // absolute, in the box
	data []byte
	mode fs.FileMode
	dir  bool
}

// volumeError is a volume that cannot be made yet (a missing ConfigMap,
// Secret or key): the pod waits in ContainerCreating with the kubelet's
// message and is retried.
type volumeError struct{ msg string }

func (e *volumeError) Error() string { return e.msg }

// checkVolumes returns why the pod's volumes and mounts cannot be made in
// a box (nil when they can).
func checkVolumes(s *corev1.PodSpec) []string {
	var why []string
	kinds := map[string]string{}
	for _, v := range s.Volumes {
		switch {
		case strings.HasPrefix(v.Name, serviceAccountVolumePrefix) && v.Projected != nil:
			kinds[v.Name] = "token"
		case v.EmptyDir != nil:
			kinds[v.Name] = "emptyDir"
			if v.EmptyDir.Medium == corev1.StorageMediumMemory {
				why = append(why, fmt.Sprintf("volume %q: emptyDir medium Memory is not supported yet", v.Name))
			}
		case v.ConfigMap != nil || v.Secret != nil:
			kinds[v.Name] = "files"
		case v.Projected != nil:
			kinds[v.Name] = "files"
			for _, src := range v.Projected.Sources {
				if src.ConfigMap == nil && src.Secret == nil {
					why = append(why, fmt.Sprintf("volume %q: projected sources other than configMap and secret are not supported yet", v.Name))
					break
				}
			}
		default:
			why = append(why, fmt.Sprintf("volume %q is not supported yet: a box takes emptyDir, configMap, secret and projected (configMap, secret) volumes", v.Name))
		}
	}
	for _, c := range s.Containers {
		emptyDirs := map[string]int{}
		for _, m := range c.VolumeMounts {
			kind := kinds[m.Name]
			if kind == "token" || kind == "" {
				continue // the token is not mounted; an unknown one is refused above
			}
			if m.SubPath != "" || m.SubPathExpr != "" {
				why = append(why, fmt.Sprintf("container %s: volume mount %q: subPath is not supported yet", c.Name, m.Name))
			}
			if kind == "emptyDir" {
				if m.ReadOnly {
					why = append(why, fmt.Sprintf("container %s: volume mount %q: a readOnly emptyDir is not supported", c.Name, m.Name))
				}
				if emptyDirs[m.Name]++; emptyDirs[m.Name] == 2 {
					why = append(why, fmt.Sprintf("container %s: emptyDir %q is mounted twice; a box directory is at one path", c.Name, m.Name))
				}
			}
		}
	}
	return why
}

// resolveVolumes returns the files and directories the container's volume
// mounts put into its box, reading ConfigMaps and Secrets through the API.
// A required source that is missing is a *volumeError.
func resolveVolumes(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, c *corev1.Container) ([]volumeFile, error) {
	return resolveVolumesFrom(ctx, func(ctx context.Context, ns, kind, name string) (map[string][]byte, error) {
		return sourceData(ctx, client, ns, kind, name)
	}, pod, c)
}

// sourceFunc returns the keys of a ConfigMap or Secret (kind) or an error
// that apierrors.IsNotFound recognises.
type sourceFunc func(ctx context.Context, ns, kind, name string) (map[string][]byte, error)

// listerSource reads ConfigMaps and Secrets from informer caches (no API
// request), as a kubelet's sync does.
func listerSource(cms corev1listers.ConfigMapLister, secrets corev1listers.SecretLister) sourceFunc {
	return func(ctx context.Context, ns, kind, name string) (map[string][]byte, error) {
		out := map[string][]byte{}
		if kind == "Secret" {
			s, err := secrets.Secrets(ns).Get(name)
			if err != nil {
				return nil, err
			}
			for k, v := range s.Data {
				out[k] = v
			}
			return out, nil
		}
		cm, err := cms.ConfigMaps(ns).Get(name)
		if err != nil {
			return nil, err
		}
		for k, v := range cm.Data {
			out[k] = []byte(v)
		}
		for k, v := range cm.BinaryData {
			out[k] = v
		}
		return out, nil
	}
}

// resolveVolumesFrom is resolveVolumes with ConfigMaps and Secrets read
// through get.
func resolveVolumesFrom(ctx context.Context, get sourceFunc, pod *corev1.Pod, c *corev1.Container) ([]volumeFile, error) {
	vols := map[string]*corev1.Volume{}
	for i := range pod.Spec.Volumes {
		vols[pod.Spec.Volumes[i].Name] = &pod.Spec.Volumes[i]
	}
	var out []volumeFile
	size := 0
	for _, m := range c.VolumeMounts {
		v := vols[m.Name]
		if v == nil || strings.HasPrefix(v.Name, serviceAccountVolumePrefix) {
			continue
		}
		if v.EmptyDir != nil {
			out = append(out, volumeFile{path: m.MountPath, mode: 0o777, dir: true})
			continue
		}
		files, err := volumeFiles(ctx, get, pod.Namespace, v)
		if err != nil {
			return nil, err
		}
		out = append(out, volumeFile{path: m.MountPath, mode: 0o755, dir: true})
		for _, f := range files {
			size += len(f.data)
			if size > maxVolumeBytes {
				return nil, fmt.Errorf("the pod's configMap and secret volumes hold over %d MiB", maxVolumeBytes>>20)
			}
			f.path = path.Join(m.MountPath, f.path)
			out = append(out, f)
		}
	}
	return out, nil
}

// volumeFiles returns the files of one configMap, secret or projected
// volume, with paths relative to its mount path.
func volumeFiles(ctx context.Context, get sourceFunc, ns string, v *corev1.Volume) ([]volumeFile, error) {
	type source struct {
		kind, name  string
		items       []corev1.KeyToPath
		optional    *bool
		defaultMode *int32
	}
	var srcs []source
	switch {
	case v.ConfigMap != nil:
		srcs = append(srcs, source{"ConfigMap", v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional, v.ConfigMap.DefaultMode})
	case v.Secret != nil:
		srcs = append(srcs, source{"Secret", v.Secret.SecretName, v.Secret.Items, v.Secret.Optional, v.Secret.DefaultMode})
	case v.Projected != nil:
		for _, p := range v.Projected.Sources {
			if p.ConfigMap != nil {
				srcs = append(srcs, source{"ConfigMap", p.ConfigMap.Name, p.ConfigMap.Items, p.ConfigMap.Optional, v.Projected.DefaultMode})
			}
			if p.Secret != nil {
				srcs = append(srcs, source{"Secret", p.Secret.Name, p.Secret.Items, p.Secret.Optional, v.Projected.DefaultMode})
			}
		}
	}
	var out []volumeFile
	for _, s := range srcs {
		data, err := get(ctx, ns, s.kind, s.name)
		if apierrors.IsNotFound(err) {
			if s.optional != nil && *s.optional {
				continue
			}
			return nil, &volumeError{fmt.Sprintf("MountVolume.SetUp failed for volume %q : %s %q not found", v.Name, strings.ToLower(s.kind), s.name)}
		}
		if err != nil {
			return nil, err
		}
		mode := fs.FileMode(0o644)
		if s.defaultMode != nil {
			mode = fs.FileMode(*s.defaultMode) & 0o777
		}
		if len(s.items) == 0 {
			keys := make([]string, 0, len(data))
			for k := range data {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				if err := checkRelPath(k); err != nil {
					return nil, fmt.Errorf("volume %q: key %q: %w", v.Name, k, err)
				}
				out = append(out, volumeFile{path: k, data: data[k], mode: mode})
			}
			continue
		}
		for _, it := range s.items {
			b, ok := data[it.Key]
			if !ok {
				if s.optional != nil && *s.optional {
					continue
				}
				return nil, &volumeError{fmt.Sprintf("MountVolume.SetUp failed for volume %q : configmap references non-existent config key: %s", v.Name, it.Key)}
			}
			if err := checkRelPath(it.Path); err != nil {
				return nil, fmt.Errorf("volume %q: item path %q: %w", v.Name, it.Path, err)
			}
			m := mode
			if it.Mode != nil {
				m = fs.FileMode(*it.Mode) & 0o777
			}
			out = append(out, volumeFile{path: it.Path, data: b, mode: m})
		}
	}
	return out, nil
}

// sourceData reads the keys of a ConfigMap (data and binaryData) or a
// Secret.
func sourceData(ctx context.Context, client kubernetes.Interface, ns, kind, name string) (map[string][]byte, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out := map[string][]byte{}
	if kind == "Secret" {
		s, err := client.CoreV1().Secrets(ns).Get(cctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		for k, v := range s.Data {
			out[k] = v
		}
		return out, nil
	}
	cm, err := client.CoreV1().ConfigMaps(ns).Get(cctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	for k, v := range cm.Data {
		out[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		out[k] = v
	}
	return out, nil
}

// checkRelPath refuses a path that is absolute or leaves its directory
// (the API server validates them too; the node does not rely on it).
func checkRelPath(p string) error {
	if p == "" || path.IsAbs(p) {
		return fmt.Errorf("must be a relative path")
	}
	for _, e := range strings.Split(p, "/") {
		if e == ".." {
			return fmt.Errorf("must not contain '..'")
		}
	}
	return nil
}

// writeVolumes makes the volume files in the box: directories first (with
// their parents), then files (owned by root and the pod's fsGroup, when
// it has one).
func writeVolumes(ctx context.Context, box *airlock.Box, pod *corev1.Pod, files []volumeFile) error {
	var opts []airlock.CopyOptions
	if sc := pod.Spec.SecurityContext; sc != nil && sc.FSGroup != nil {
		opts = append(opts, airlock.CopyOptions{Owner: true, UID: 0, GID: int(*sc.FSGroup)})
	}
	for _, f := range files {
		dir := f.path
		if !f.dir {
			dir = path.Dir(f.path)
		}
		if err := box.MkdirAll(ctx, dir, 0o755); err != nil {
			return fmt.Errorf("making %s in the box: %w", dir, err)
		}
		if f.dir {
			if f.mode == 0o777 {
				// emptyDir: open to every user of the box, as a kubelet
				// makes it (MkdirAll's mode is under the agent's umask).
				// Best effort: an image without chmod keeps 0755.
				box.Exec(ctx, "chmod", []string{"0777", f.path}, airlock.ExecOptions{User: "0", Timeout: 10 * time.Second})
			}
			continue
		}
		if err := box.WriteFile(ctx, f.path, f.data, f.mode, opts...); err != nil {
			return fmt.Errorf("writing %s in the box: %w", f.path, err)
		}
	}
	return nil
}

// volumeSyncInterval is how often the files of a running pod's configMap,
// secret and projected volumes are compared with their sources (a
// kubelet's sync period is a minute, plus its cache's TTL).
const volumeSyncInterval = 5 * time.Second

// hasAPIVolumes says whether the pod mounts a configMap, secret or
// projected volume (other than the service-account token).
func hasAPIVolumes(pod *corev1.Pod) bool {
	for _, v := range pod.Spec.Volumes {
		if (v.ConfigMap != nil || v.Secret != nil || v.Projected != nil) && !strings.HasPrefix(v.Name, serviceAccountVolumePrefix) {
			return true
		}
	}
	return false
}

// syncVolumes keeps the files of the pod's configMap, secret and
// projected volumes in box in step with their sources until ctx ends:
// every volumeSyncInterval it reads them again (from the node's informer
// caches) and writes the files that
// changed, makes new ones and removes those whose key is gone. While a
// source is missing the files stay as they are (as a kubelet keeps them).
// A write that fails (the box restarting) is tried at the next round.
func (p *Provider) syncVolumes(ctx context.Context, pb *podBox, box *airlock.Box, written []volumeFile) {
	pod := pb.pod
	type state struct {
		data string
		mode fs.FileMode
	}
	last := map[string]state{}
	for _, f := range written {
		if !f.dir {
			last[f.path] = state{string(f.data), f.mode}
		}
	}
	t := time.NewTicker(volumeSyncInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		get := p.volumeSource()
		if get == nil {
			continue
		}
		files, err := resolveVolumesFrom(ctx, get, pod, &pod.Spec.Containers[0])
		if err != nil {
			continue
		}
		var changed []volumeFile
		now := map[string]bool{}
		for _, f := range files {
			if f.dir {
				continue
			}
			now[f.path] = true
			if s, ok := last[f.path]; !ok || s.data != string(f.data) || s.mode != f.mode {
				changed = append(changed, f)
			}
		}
		if len(changed) > 0 {
			if err := writeVolumes(ctx, box, pod, changed); err != nil {
				continue
			}
			for _, f := range changed {
				last[f.path] = state{string(f.data), f.mode}
			}
		}
		for path := range last {
			if now[path] {
				continue
			}
			if err := box.RemovePath(ctx, path); err == nil || errors.Is(err, fs.ErrNotExist) {
				delete(last, path)
			}
		}
		if len(changed) > 0 {
			p.logf("pod %s/%s: %d volume file(s) updated", pod.Namespace, pod.Name, len(changed))
		}
	}
}

// volumeSource reads ConfigMaps and Secrets from the node's informer
// caches, or nil before virtual-kubelet has given them.
func (p *Provider) volumeSource() sourceFunc {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmLister == nil || p.secretLister == nil {
		return nil
	}
	return listerSource(p.cmLister, p.secretLister)
}
