package kubenode

import (
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestCommand: the argv a container runs follows Kubernetes' rules for
// command, args and the image's entrypoint and cmd, and expands $(VAR).
func TestCommand(t *testing.T) {
	entry, cmd := []string{"/entry"}, []string{"default", "args"}
	env := []corev1.EnvVar{{Name: "WHO", Value: "box"}}
	for _, tc := range []struct {
		name          string
		command, args []string
		want          []string
	}{
		{"image's own", nil, nil, []string{"/entry", "default", "args"}},
		{"args replace cmd", nil, []string{"x"}, []string{"/entry", "x"}},
		{"command replaces both", []string{"sh", "-c"}, nil, []string{"sh", "-c"}},
		{"command and args", []string{"echo"}, []string{"$(WHO)", "$$(WHO)", "$(NOPE)"}, []string{"echo", "box", "$(WHO)", "$(NOPE)"}},
	} {
		c := &corev1.Container{Image: "img", Command: tc.command, Args: tc.args, Env: env}
		got, err := command(c, entry, cmd)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: command = %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	if _, err := command(&corev1.Container{Image: "img"}, nil, nil); err == nil || !strings.Contains(err.Error(), "no command") {
		t.Errorf("no command anywhere: err = %v", err)
	}
}

// TestCheckPod: what a box cannot honour is refused, with the reason in
// words; the service-account token volume the API server adds is not.
func TestCheckPod(t *testing.T) {
	one := corev1.Container{Name: "c", Image: "img",
		VolumeMounts: []corev1.VolumeMount{{Name: "kube-api-access-abcde", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"}}}
	ok := corev1.Pod{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{one},
		Volumes: []corev1.Volume{{Name: "kube-api-access-abcde", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}}}}}
	if why := checkPod(&ok); why != "" {
		t.Fatalf("a plain pod is refused: %s", why)
	}
	withVolumes := ok.DeepCopy()
	withVolumes.Spec.RestartPolicy = corev1.RestartPolicyAlways
	withVolumes.Spec.Volumes = append(withVolumes.Spec.Volumes,
		corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		corev1.Volume{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "c"}}}},
		corev1.Volume{Name: "sec", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "s"}}})
	withVolumes.Spec.Containers[0].VolumeMounts = append(withVolumes.Spec.Containers[0].VolumeMounts,
		corev1.VolumeMount{Name: "scratch", MountPath: "/scratch"}, corev1.VolumeMount{Name: "cfg", MountPath: "/etc/cfg"}, corev1.VolumeMount{Name: "sec", MountPath: "/etc/sec"})
	if why := checkPod(withVolumes); why != "" {
		t.Fatalf("a pod with restartPolicy Always and emptyDir, configMap and secret volumes is refused: %s", why)
	}
	for _, tc := range []struct {
		name string
		edit func(*corev1.Pod)
		want string
	}{
		{"two containers", func(p *corev1.Pod) { p.Spec.Containers = append(p.Spec.Containers, one) }, "2 containers"},
		{"hostPath", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		}, `volume "host" is not supported yet`},
		{"emptyDir in memory", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}})
		}, `emptyDir medium Memory`},
		{"subPath", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
			p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "scratch", MountPath: "/s", SubPath: "x"})
		}, `subPath`},
		{"projected downwardAPI", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "info", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{DownwardAPI: &corev1.DownwardAPIProjection{}}}}}})
		}, `projected sources other than configMap and secret`},
		{"init container", func(p *corev1.Pod) { p.Spec.InitContainers = []corev1.Container{one} }, "init containers"},
	} {
		p := ok.DeepCopy()
		tc.edit(p)
		if why := checkPod(p); !strings.Contains(why, tc.want) {
			t.Errorf("%s: checkPod = %q, want it to say %q", tc.name, why, tc.want)
		}
	}
	// Without the API, env from it is refused (not run without it).
	p := ok.DeepCopy()
	p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{}}}
	if why := checkEnvRefs(p); !strings.Contains(why, "valueFrom") {
		t.Errorf("checkEnvRefs = %q", why)
	}
}

// TestBoxOptions: limits size the box (cpu rounded up to whole vCPUs,
// memory to MiB); env, workingDir and runAsUser carry over; the box is
// named after the pod's UID.
func TestBoxOptions(t *testing.T) {
	uid := int64(1000)
	p := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Image: "python:slim", WorkingDir: "/work", Env: []corev1.EnvVar{{Name: "A", Value: "1"}},
		SecurityContext: &corev1.SecurityContext{RunAsUser: &uid},
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("1500m"), corev1.ResourceMemory: resource.MustParse("256Mi")}},
	}}}}
	p.UID = "1234-abcd"
	o, err := boxOptions(p)
	if err != nil {
		t.Fatal(err)
	}
	if o.Name != "k8s-1234-abcd" || o.Image != "python:slim" || o.CPUs != 2 || o.MemoryMiB != 256 ||
		o.WorkingDir != "/work" || o.User != "1000" || !reflect.DeepEqual(o.Env, []string{"A=1"}) {
		t.Errorf("boxOptions = %+v", o)
	}
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")}}
	if o, _ := boxOptions(p); o.CPUs != 0 || o.MemoryMiB != 0 {
		t.Errorf("requests alone must leave airlock's defaults: %+v", o)
	}
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("8Mi")}}
	if _, err := boxOptions(p); err == nil {
		t.Error("an 8Mi memory limit was taken")
	}
}
