package kubenode

import (
	"context"
	"errors"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kfake "k8s.io/client-go/kubernetes/fake"
)

// TestResolveEnv: env from the API as a kubelet makes it (client-go's fake
// clientset): envFrom with its prefix (invalid names skipped), then env in
// order, later names replacing earlier ones; ConfigMap and Secret keys,
// the downward API, resource limits, $(VAR) of earlier names; optional
// sources that are missing leave the variable out.
func TestResolveEnv(t *testing.T) {
	client := kfake.NewClientset(
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg", Namespace: "ns"}, Data: map[string]string{"mode": "fast", "A": "from-cm", "bad=name": "x"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sec", Namespace: "ns"}, Data: map[string][]byte{"token": []byte("s3cret")}},
	)
	f := false
	tr := true
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u-1", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "main",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi"), corev1.ResourceCPU: resource.MustParse("1500m")}},
			EnvFrom:   []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}, Prefix: "CM_"}},
			Env: []corev1.EnvVar{
				{Name: "CM_A", Value: "plain wins"},
				{Name: "MODE", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, Key: "mode"}}},
				{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "sec"}, Key: "token", Optional: &f}}},
				{Name: "NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				{Name: "NS", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
				{Name: "UID", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.uid"}}},
				{Name: "APP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
				{Name: "HOST_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
				{Name: "MEM_MI", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}}},
				{Name: "CPUS", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.cpu"}}},
				{Name: "GONE", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}, Key: "k", Optional: &tr}}},
				{Name: "URL", Value: "http://$(NAME).$(NS):$(MISSING)"},
			}}}}}
	env, err := resolveEnv(context.Background(), client, pod, &pod.Spec.Containers[0], "10.1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	want := []corev1.EnvVar{{Name: "CM_A", Value: "plain wins"}, {Name: "CM_mode", Value: "fast"},
		{Name: "MODE", Value: "fast"}, {Name: "TOKEN", Value: "s3cret"}, {Name: "NAME", Value: "p"}, {Name: "NS", Value: "ns"},
		{Name: "UID", Value: "u-1"}, {Name: "APP", Value: "web"}, {Name: "HOST_IP", Value: "10.1.2.3"},
		{Name: "MEM_MI", Value: "256"}, {Name: "CPUS", Value: "2"}, {Name: "URL", Value: "http://p.ns:$(MISSING)"}}
	if !reflect.DeepEqual(env, want) {
		t.Errorf("env =\n%v\nwant\n%v", env, want)
	}
}

// TestResolveEnvMissing: a required Secret, ConfigMap or key that is
// missing is a config error with the kubelet's message.
func TestResolveEnvMissing(t *testing.T) {
	client := kfake.NewClientset(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sec", Namespace: "ns"}, Data: map[string][]byte{"a": nil}})
	for _, tc := range []struct {
		env  corev1.EnvVar
		from []corev1.EnvFromSource
		want string
	}{
		{env: corev1.EnvVar{Name: "X", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}, Key: "k"}}},
			want: `secret "nope" not found`},
		{env: corev1.EnvVar{Name: "X", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "sec"}, Key: "k"}}},
			want: `couldn't find key k in Secret ns/sec`},
		{env: corev1.EnvVar{Name: "X", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}, Key: "k"}}},
			want: `configmap "cm" not found`},
		{from: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "other"}}}},
			want: `secret "other" not found`},
	} {
		c := corev1.Container{Name: "main", EnvFrom: tc.from}
		if tc.env.Name != "" {
			c.Env = []corev1.EnvVar{tc.env}
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}, Spec: corev1.PodSpec{Containers: []corev1.Container{c}}}
		_, err := resolveEnv(context.Background(), client, pod, &pod.Spec.Containers[0], "")
		var ce *configError
		if !errors.As(err, &ce) || ce.msg != tc.want {
			t.Errorf("err = %v, want config error %q", err, tc.want)
		}
	}
}
