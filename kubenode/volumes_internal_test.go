package kubenode

import (
	"context"
	"errors"
	"io/fs"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kfake "k8s.io/client-go/kubernetes/fake"
)

// TestResolveVolumes: configMap (data and binaryData), secret and
// projected volumes become files at their mount path with Kubernetes'
// modes (defaultMode, items with path and mode); an emptyDir is a 0777
// directory; a missing source is a volumeError with the kubelet's
// message, unless optional; the token volume is left out.
func TestResolveVolumes(t *testing.T) {
	client := kfake.NewClientset(
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg", Namespace: "default"},
			Data: map[string]string{"a.conf": "A", "b.conf": "B"}, BinaryData: map[string][]byte{"bin": {0, 1}}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sec", Namespace: "default"}, Data: map[string][]byte{"token": []byte("s3cret")}},
	)
	mode := int32(0o600)
	yes := true
	ref := func(n string) corev1.LocalObjectReference { return corev1.LocalObjectReference{Name: n} }
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}, Spec: corev1.PodSpec{
		Volumes: []corev1.Volume{
			{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: ref("cfg")}}},
			{Name: "sec", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "sec", DefaultMode: &mode}}},
			{Name: "proj", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: ref("cfg"), Items: []corev1.KeyToPath{{Key: "a.conf", Path: "sub/a"}}}},
				{Secret: &corev1.SecretProjection{LocalObjectReference: ref("gone"), Optional: &yes}},
			}}}},
			{Name: "kube-api-access-x", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}},
		},
		Containers: []corev1.Container{{Name: "c", VolumeMounts: []corev1.VolumeMount{
			{Name: "scratch", MountPath: "/scratch"}, {Name: "cfg", MountPath: "/etc/cfg"}, {Name: "sec", MountPath: "/etc/sec"},
			{Name: "proj", MountPath: "/proj"}, {Name: "kube-api-access-x", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"},
		}}},
	}}
	files, err := resolveVolumes(context.Background(), client, pod, &pod.Spec.Containers[0])
	if err != nil {
		t.Fatal(err)
	}
	want := []volumeFile{
		{path: "/scratch", mode: 0o777, dir: true},
		{path: "/etc/cfg", mode: 0o755, dir: true},
		{path: "/etc/cfg/a.conf", data: []byte("A"), mode: 0o644},
		{path: "/etc/cfg/b.conf", data: []byte("B"), mode: 0o644},
		{path: "/etc/cfg/bin", data: []byte{0, 1}, mode: 0o644},
		{path: "/etc/sec", mode: 0o755, dir: true},
		{path: "/etc/sec/token", data: []byte("s3cret"), mode: fs.FileMode(0o600)},
		{path: "/proj", mode: 0o755, dir: true},
		{path: "/proj/sub/a", data: []byte("A"), mode: 0o644},
	}
	if !reflect.DeepEqual(files, want) {
		t.Errorf("files:\n got %+v\nwant %+v", files, want)
	}

	pod.Spec.Volumes[2].Secret.SecretName = "missing"
	_, err = resolveVolumes(context.Background(), client, pod, &pod.Spec.Containers[0])
	var ve *volumeError
	if !errors.As(err, &ve) || err.Error() != `MountVolume.SetUp failed for volume "sec" : secret "missing" not found` {
		t.Errorf("missing secret: %v", err)
	}
}
