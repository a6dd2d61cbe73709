package kubenode

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ReasonConfigError is the waiting reason of a container whose env cannot
// be made (a ConfigMap, Secret or key it requires is missing), as a
// kubelet's: the pod stays Pending and is retried until it can start.
const ReasonConfigError = "CreateContainerConfigError"

// configRetry bounds the wait between two tries of a pod whose env could
// not be made.
const configRetry = 10 * time.Second

// maxEnvBytes bounds a container's resolved env (names and values); past
// it the pod fails to start (ConfigMaps and Secrets hold up to 1 MiB
// each, and a pod may name many).
const maxEnvBytes = 4 << 20

// configError is an env that cannot be made yet (a missing ConfigMap,
// Secret or key): the pod waits with ReasonConfigError and is retried.
type configError struct{ msg string }

func (e *configError) Error() string { return e.msg }

// resolveEnv returns the container's env as plain values, as a kubelet
// makes it: envFrom (ConfigMaps and Secrets, with their prefix; keys that
// are no env names are skipped), then env in order, later names replacing
// earlier ones, with valueFrom resolved through the API (configMapKeyRef,
// secretKeyRef, fieldRef of metadata.name, namespace, uid, labels,
// annotations, spec.nodeName, spec.serviceAccountName, status.hostIP,
// status.podIP; resourceFieldRef of the container's limits and requests)
// and $(VAR) references to earlier names expanded. A required source that
// is missing is a *configError with the kubelet's message.
func resolveEnv(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, c *corev1.Container, hostIP string) ([]corev1.EnvVar, error) {
	var out []corev1.EnvVar
	index := map[string]int{}
	size := 0
	set := func(name, value string) error {
		size += len(name) + len(value)
		if size > maxEnvBytes {
			return fmt.Errorf("the container's env is over %d MiB", maxEnvBytes>>20)
		}
		if i, ok := index[name]; ok {
			out[i].Value = value
			return nil
		}
		index[name] = len(out)
		out = append(out, corev1.EnvVar{Name: name, Value: value})
		return nil
	}
	cms := map[string]*corev1.ConfigMap{}
	secrets := map[string]*corev1.Secret{}
	getCM := func(name string) (*corev1.ConfigMap, error) {
		if cm, ok := cms[name]; ok {
			return cm, nil
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		cm, err := client.CoreV1().ConfigMaps(pod.Namespace).Get(cctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		cms[name] = cm
		return cm, nil
	}
	getSecret := func(name string) (*corev1.Secret, error) {
		if s, ok := secrets[name]; ok {
			return s, nil
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		s, err := client.CoreV1().Secrets(pod.Namespace).Get(cctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		secrets[name] = s
		return s, nil
	}
	// missing turns a failed Get into the kubelet's error: a configError
	// when the object is not there (and not optional), nil when optional.
	missing := func(err error, kind, name string, optional *bool) error {
		if apierrors.IsNotFound(err) {
			if optional != nil && *optional {
				return nil
			}
			return &configError{fmt.Sprintf("%s %q not found", strings.ToLower(kind), name)}
		}
		return fmt.Errorf("reading %s %s/%s: %w", kind, pod.Namespace, name, err)
	}

	for _, ef := range c.EnvFrom {
		var data map[string]string
		switch {
		case ef.ConfigMapRef != nil:
			cm, err := getCM(ef.ConfigMapRef.Name)
			if err != nil {
				if err := missing(err, "ConfigMap", ef.ConfigMapRef.Name, ef.ConfigMapRef.Optional); err != nil {
					return nil, err
				}
				continue
			}
			data = cm.Data
		case ef.SecretRef != nil:
			s, err := getSecret(ef.SecretRef.Name)
			if err != nil {
				if err := missing(err, "Secret", ef.SecretRef.Name, ef.SecretRef.Optional); err != nil {
					return nil, err
				}
				continue
			}
			data = map[string]string{}
			for k, v := range s.Data {
				data[k] = string(v)
			}
		}
		for _, k := range sortedKeys(data) {
			name := ef.Prefix + k
			if !validEnvName(name) {
				continue // the kubelet skips them too (with an event)
			}
			if err := set(name, data[k]); err != nil {
				return nil, err
			}
		}
	}
	for _, e := range c.Env {
		value := e.Value
		if value != "" {
			value = expand(value, envMap(out))
		}
		if vf := e.ValueFrom; vf != nil {
			var err error
			value, err = valueFrom(vf, pod, c, hostIP, getCM, getSecret, missing)
			var skip *skipVar
			if errors.As(err, &skip) {
				continue
			}
			if err != nil {
				return nil, err
			}
		}
		if err := set(e.Name, value); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// skipVar is an optional source that is missing: the variable is left out.
type skipVar struct{}

func (*skipVar) Error() string { return "optional source missing" }

func valueFrom(vf *corev1.EnvVarSource, pod *corev1.Pod, c *corev1.Container, hostIP string,
	getCM func(string) (*corev1.ConfigMap, error), getSecret func(string) (*corev1.Secret, error),
	missing func(error, string, string, *bool) error) (string, error) {
	optional := func(o *bool) bool { return o != nil && *o }
	switch {
	case vf.ConfigMapKeyRef != nil:
		r := vf.ConfigMapKeyRef
		cm, err := getCM(r.Name)
		if err != nil {
			if err := missing(err, "ConfigMap", r.Name, r.Optional); err != nil {
				return "", err
			}
			return "", &skipVar{}
		}
		v, ok := cm.Data[r.Key]
		if !ok {
			if b, okb := cm.BinaryData[r.Key]; okb {
				return string(b), nil
			}
			if optional(r.Optional) {
				return "", &skipVar{}
			}
			return "", &configError{fmt.Sprintf("couldn't find key %s in ConfigMap %s/%s", r.Key, pod.Namespace, r.Name)}
		}
		return v, nil
	case vf.SecretKeyRef != nil:
		r := vf.SecretKeyRef
		s, err := getSecret(r.Name)
		if err != nil {
			if err := missing(err, "Secret", r.Name, r.Optional); err != nil {
				return "", err
			}
			return "", &skipVar{}
		}
		v, ok := s.Data[r.Key]
		if !ok {
			if optional(r.Optional) {
				return "", &skipVar{}
			}
			return "", &configError{fmt.Sprintf("couldn't find key %s in Secret %s/%s", r.Key, pod.Namespace, r.Name)}
		}
		return string(v), nil
	case vf.FieldRef != nil:
		return fieldRef(vf.FieldRef.FieldPath, pod, hostIP)
	case vf.ResourceFieldRef != nil:
		return resourceField(vf.ResourceFieldRef, c)
	}
	return "", fmt.Errorf("env valueFrom: no source set")
}

// fieldRef resolves a downward-API field of the pod.
func fieldRef(path string, pod *corev1.Pod, hostIP string) (string, error) {
	if k, ok := strings.CutPrefix(path, "metadata.labels['"); ok && strings.HasSuffix(k, "']") {
		return pod.Labels[strings.TrimSuffix(k, "']")], nil
	}
	if k, ok := strings.CutPrefix(path, "metadata.annotations['"); ok && strings.HasSuffix(k, "']") {
		return pod.Annotations[strings.TrimSuffix(k, "']")], nil
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs":
		// A pod's IP is its node's (see statusLocked), as a hostNetwork
		// pod's.
		return hostIP, nil
	}
	return "", fmt.Errorf("env fieldRef %q is not supported", path)
}

// resourceField resolves a resourceFieldRef of the container (limits and
// requests of cpu, memory, ephemeral-storage), in the divisor's units
// rounded up, as Kubernetes does.
func resourceField(r *corev1.ResourceFieldSelector, c *corev1.Container) (string, error) {
	var q resource.Quantity
	var ok bool
	switch {
	case strings.HasPrefix(r.Resource, "limits."):
		q, ok = c.Resources.Limits[corev1.ResourceName(strings.TrimPrefix(r.Resource, "limits."))]
	case strings.HasPrefix(r.Resource, "requests."):
		q, ok = c.Resources.Requests[corev1.ResourceName(strings.TrimPrefix(r.Resource, "requests."))]
	default:
		return "", fmt.Errorf("env resourceFieldRef %q is not supported", r.Resource)
	}
	if !ok {
		return "0", nil
	}
	div := r.Divisor
	if div.IsZero() {
		if strings.HasSuffix(r.Resource, ".cpu") {
			return strconv.FormatInt((q.MilliValue()+999)/1000, 10), nil
		}
		return strconv.FormatInt(q.Value(), 10), nil
	}
	if strings.HasSuffix(r.Resource, ".cpu") {
		m, d := q.MilliValue(), div.MilliValue()
		return strconv.FormatInt((m+d-1)/d, 10), nil
	}
	v, d := q.Value(), div.Value()
	return strconv.FormatInt((v+d-1)/d, 10), nil
}

func envMap(env []corev1.EnvVar) map[string]string {
	m := make(map[string]string, len(env))
	for _, e := range env {
		m[e.Name] = e.Value
	}
	return m
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// validEnvName reports whether s is a name Kubernetes accepts for an env
// variable (C identifiers and more: any printable but '=').
func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r == '=' || r < 0x20 || r > 0x7e {
			return false
		}
	}
	return true
}
