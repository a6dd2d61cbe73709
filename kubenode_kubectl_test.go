package airlock_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	osexec "os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/airlock-run/airlock/internal/vmtest"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestKubeKubectl: the real kubectl reaches a pod's box through the API
// server and the node's kubelet API (TLS, the API server's client
// certificate): logs with --tail, --timestamps, --since, --previous
// (refused as Kubernetes refuses it) and -f (which ends with the
// container); exec with its exit code, with stdin, and with -it on a
// terminal (its size, a resize, Ctrl-C); attach; /stats/summary with the
// pod's box. The kubelet API refuses a client without credentials. A pod's
// env from a Secret, a ConfigMap (envFrom) and the downward API: while the
// Secret is missing the pod waits with CreateContainerConfigError. Fake
// driver: the box's commands run on the host.
func TestKubeKubectl(t *testing.T) {
	c := kubeStart(t)
	rt := kubeRuntime(t)
	const node = "airlock-kubectl"
	c.startNode(rt, node)
	c.kubectl("apply", "-f", "deploy/kubernetes/")
	c.waitDefaultSA()
	ctx := context.Background()

	gate := filepath.Join(t.TempDir(), "gate")
	rc := "airlock"
	script := `echo one; echo two; echo err >&2; while [ ! -e ` + gate + ` ]; do echo tick; sleep 0.2; done; echo three`
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "talk"},
		Spec: corev1.PodSpec{RuntimeClassName: &rc, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "main", Image: kubeRef, Command: []string{"sh", "-c", script},
				Env: []corev1.EnvVar{{Name: "GREETING", Value: "hello"}}}}},
	}
	if _, err := c.client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A pod whose container fails twice, then succeeds (restartPolicy
	// OnFailure; a count file on the host numbers the runs): restarted
	// at once, then after a back-off; checked at the end.
	count := filepath.Join(t.TempDir(), "count")
	crash := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "crash"},
		Spec: corev1.PodSpec{RuntimeClassName: &rc, RestartPolicy: corev1.RestartPolicyOnFailure,
			Containers: []corev1.Container{{Name: "main", Image: kubeRef, Command: []string{"sh", "-c",
				`n=$(cat ` + count + ` 2>/dev/null || echo 0); n=$((n+1)); echo $n >` + count + `; echo "run $n"; [ $n -ge 3 ]`}}}},
	}
	if _, err := c.client.CoreV1().Pods("default").Create(ctx, crash, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A pod whose env comes from a Secret not made yet waits with
	// CreateContainerConfigError, then runs once the Secret is there.
	envPod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "env"},
		Spec: corev1.PodSpec{RuntimeClassName: &rc, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "main", Image: kubeRef, Command: []string{"sh", "-c", `echo "$TOKEN $NAME $MODE"`},
				Env: []corev1.EnvVar{
					{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "token"}}},
					{Name: "NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				},
				EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}},
			}}},
	}
	if _, err := c.client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings"},
		Data: map[string]string{"MODE": "fast"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.client.CoreV1().Pods("default").Create(ctx, envPod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() string {
		p, err := c.client.CoreV1().Pods("default").Get(ctx, "env", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Waiting == nil {
			return "pod env: no waiting container"
		}
		w := p.Status.ContainerStatuses[0].State.Waiting
		if p.Status.Phase != corev1.PodPending || w.Reason != "CreateContainerConfigError" || w.Message != `secret "creds" not found` {
			return "pod env: " + string(p.Status.Phase) + " " + w.Reason + ": " + w.Message
		}
		return ""
	})
	if _, err := c.client.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds"},
		Data: map[string][]byte{"token": []byte("s3cret")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() string {
		p, err := c.client.CoreV1().Pods("default").Get(ctx, "talk", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if p.Status.Phase != corev1.PodRunning {
			return "phase " + string(p.Status.Phase)
		}
		return ""
	})

	eventually(t, 60*time.Second, func() string {
		p, err := c.client.CoreV1().Pods("default").Get(ctx, "env", metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodSucceeded {
			return "pod env not Succeeded after its Secret was made"
		}
		return ""
	})
	if out := c.kubectl("logs", "env"); out != "s3cret env fast\n" {
		t.Errorf("env from the API: logs %q", out)
	}

	t0 := time.Now()
	// logs, with its options. The pod's stdout and stderr are separate
	// streams from the guest, so "err" may come anywhere among stdout's
	// lines (even between "one" and "two"): stdout's order is checked
	// without it.
	stdoutOf := func(out string) string { return strings.ReplaceAll(out, "err\n", "") }
	eventually(t, 10*time.Second, func() string {
		out, code := c.kubectlExit("", "logs", "talk")
		if code != 0 || !strings.Contains(stdoutOf(out), "one\ntwo\n") || !strings.Contains(out, "err\n") || !strings.Contains(out, "tick\n") {
			return "kubectl logs: " + out
		}
		return ""
	})
	if out := c.kubectl("logs", "talk", "--tail=1"); out != "tick\n" {
		t.Errorf("logs --tail=1 = %q", out)
	}
	if out := c.kubectl("logs", "talk", "--tail=1", "--timestamps"); !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z tick\n$`).MatchString(out) {
		t.Errorf("logs --timestamps = %q", out)
	}
	if out := c.kubectl("logs", "talk", "--since=1h"); !strings.Contains(stdoutOf(out), "one\ntwo\n") {
		t.Errorf("logs --since=1h = %q", out)
	}
	if out := c.kubectl("logs", "talk", "--since-time="+time.Now().Add(time.Hour).UTC().Format(time.RFC3339)); out != "" {
		t.Errorf("logs --since-time in the future = %q", out)
	}
	if out, code := c.kubectlExit("", "logs", "talk", "--previous"); code == 0 || !strings.Contains(out, `previous terminated container "main" in pod "talk" not found`) {
		t.Errorf("logs --previous: exit %d, %q", code, out)
	}
	t.Logf("kubectl logs (6 calls): %s", time.Since(t0).Round(time.Millisecond))

	// exec: exit code, env of the pod, stdin.
	t0 = time.Now()
	out, code := c.kubectlExit("", "exec", "talk", "--", "sh", "-c", `echo "in box $GREETING"; exit 3`)
	if code != 3 || !strings.Contains(out, "in box hello") {
		t.Errorf("kubectl exec exit 3: exit %d, %q", code, out)
	}
	t.Logf("kubectl exec: %s", time.Since(t0).Round(time.Millisecond))
	if out, code := c.kubectlExit("piped in\n", "exec", "-i", "talk", "--", "cat"); code != 0 || out != "piped in\n" {
		t.Errorf("kubectl exec -i cat: exit %d, %q", code, out)
	}
	if out, code := c.kubectlExit("", "exec", "talk", "-c", "nope", "--", "true"); code == 0 || !strings.Contains(out, "nope") {
		t.Errorf("kubectl exec -c nope: exit %d, %q", code, out)
	}

	// exec -it on a terminal: its size, a resize, Ctrl-C.
	t0 = time.Now()
	cmd := c.kubectlCmd("exec", "-it", "talk", "--", "sh", "-c", `stty size; read x; stty size; echo ready; sleep 30`)
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 100})
	if err != nil {
		t.Fatal(err)
	}
	var term syncBuffer
	go io.Copy(&term, tty)
	waitOut := func(what string) {
		t.Helper()
		eventually(t, 15*time.Second, func() string {
			if !strings.Contains(term.String(), what) {
				return "exec -it: terminal shows " + strconv.Quote(term.String()) + ", waiting for " + strconv.Quote(what)
			}
			return ""
		})
	}
	waitOut("40 100")
	if err := pty.Setsize(tty, &pty.Winsize{Rows: 50, Cols: 120}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // kubectl forwards the SIGWINCH
	tty.Write([]byte("x\r"))
	waitOut("50 120")
	waitOut("ready")
	tty.Write([]byte{3}) // Ctrl-C
	waitErr := make(chan error, 1)
	go func() { waitErr <- cmd.Wait() }()
	select {
	case <-waitErr:
		if cmd.ProcessState.ExitCode() != 130 {
			t.Errorf("kubectl exec -it after Ctrl-C: exit %d, want 130; terminal %q", cmd.ProcessState.ExitCode(), term.String())
		}
	case <-time.After(15 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("kubectl exec -it did not end after Ctrl-C; terminal %q", term.String())
	}
	tty.Close()
	t.Logf("kubectl exec -it session: %s", time.Since(t0).Round(time.Millisecond))

	// The kubelet API as metrics tooling calls it (directly, with the
	// API server's client certificate; the API server's node proxy
	// refuses loopback nodes), and without credentials.
	n, err := c.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	port := n.Status.DaemonEndpoints.KubeletEndpoint.Port
	if port == 0 || len(n.Status.Addresses) == 0 || n.Status.Addresses[0].Address != "127.0.0.1" {
		t.Fatalf("node endpoint %d, addresses %v", port, n.Status.Addresses)
	}
	pki := filepath.Join(c.dir, "pki")
	ca, err := os.ReadFile(filepath.Join(pki, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cert, err := tls.LoadX509KeyPair(filepath.Join(pki, "kubelet-client.crt"), filepath.Join(pki, "kubelet-client.key"))
	if err != nil {
		t.Fatal(err)
	}
	kubeletURL := "https://127.0.0.1:" + strconv.Itoa(int(port))
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}}
	resp, err := hc.Get(kubeletURL + "/stats/summary")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	var sum statsv1alpha1.Summary
	if err := json.Unmarshal(raw, &sum); err != nil {
		t.Fatalf("stats/summary: %s: %v\n%s", resp.Status, err, raw)
	}
	if sum.Node.NodeName != node || sum.Node.Memory == nil || sum.Node.CPU == nil {
		t.Errorf("stats/summary node = %+v", sum.Node)
	}
	found := false
	for _, ps := range sum.Pods {
		if ps.PodRef.Name == "talk" {
			found = true
			if ps.Memory == nil || ps.Memory.WorkingSetBytes == nil || *ps.Memory.WorkingSetBytes == 0 || ps.CPU == nil || len(ps.Containers) != 1 {
				t.Errorf("stats/summary of pod talk = %+v", ps)
			}
		}
	}
	if !found {
		t.Errorf("stats/summary lists no pod talk: %s", raw)
	}
	anon := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err = anon.Get(kubeletURL + "/containerLogs/default/talk/main")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("kubelet API without credentials: %s, want 401", resp.Status)
	}

	// attach and logs -f see the output that follows and end with the
	// container.
	attach := c.kubectlCmd("attach", "talk")
	var attachOut syncBuffer
	attach.Stdout, attach.Stderr = &attachOut, &attachOut
	follow := c.kubectlCmd("logs", "-f", "talk")
	var followOut syncBuffer
	follow.Stdout, follow.Stderr = &followOut, &followOut
	for _, cmd := range []*osexec.Cmd{attach, follow} {
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 15*time.Second, func() string {
		if !strings.Contains(attachOut.String(), "tick") {
			return "kubectl attach: " + attachOut.String()
		}
		return ""
	})
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, cmd := range map[string]*osexec.Cmd{"attach": attach, "logs -f": follow} {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("kubectl %s: %v", name, err)
			}
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			t.Errorf("kubectl %s did not end with the container", name)
		}
	}
	if got := attachOut.String(); !strings.HasSuffix(got, "tick\nthree\n") || strings.Contains(got, "one\n") {
		t.Errorf("kubectl attach printed %q, want the output from its start to the end", got)
	}
	if got := followOut.String(); !strings.Contains(stdoutOf(got), "one\ntwo\n") || !strings.Contains(got, "err\n") || !strings.HasSuffix(got, "three\n") {
		t.Errorf("kubectl logs -f printed %q", got)
	}
	// The container ended: exec says so.
	eventually(t, 30*time.Second, func() string {
		p, err := c.client.CoreV1().Pods("default").Get(ctx, "talk", metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodSucceeded {
			return "pod talk not Succeeded"
		}
		return ""
	})
	if out, code := c.kubectlExit("", "exec", "talk", "--", "true"); code == 0 {
		t.Errorf("kubectl exec into a completed pod: exit 0, %q", out)
	}

	// The crashing pod: two restarts (the second after a 10 s back-off),
	// then done; logs show the last run, --previous the one before.
	eventually(t, 90*time.Second, func() string {
		p, err := c.client.CoreV1().Pods("default").Get(ctx, "crash", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if p.Status.Phase != corev1.PodSucceeded || len(p.Status.ContainerStatuses) != 1 {
			return "pod crash: phase " + string(p.Status.Phase)
		}
		cs := p.Status.ContainerStatuses[0]
		last := cs.LastTerminationState.Terminated
		if cs.RestartCount != 2 || last == nil || last.ExitCode != 1 || last.Reason != "Error" || cs.State.Terminated == nil || cs.State.Terminated.ExitCode != 0 {
			t.Fatalf("pod crash: restartCount %d, lastState %+v, state %+v", cs.RestartCount, cs.LastTerminationState, cs.State)
		}
		return ""
	})
	if out := c.kubectl("logs", "crash"); out != "run 3\n" {
		t.Errorf("logs of the restarted container: %q", out)
	}
	if out := c.kubectl("logs", "crash", "--previous"); out != "run 2\n" {
		t.Errorf("logs --previous of the restarted container: %q", out)
	}
}

// TestKubeKubectlVM: on real VMs, kubectl exec runs python3 in the pod's
// box and brings back a non-zero exit status, and kubectl port-forward
// reaches a python3 http.server in the box (Box.DialPort: no port
// published).
func TestKubeKubectlVM(t *testing.T) {
	vmtest.Require(t)
	c := kubeStart(t)
	rt := openRuntime(t, "")
	const node = "airlock-vm"
	c.startNode(rt, node)
	c.kubectl("apply", "-f", "deploy/kubernetes/")
	c.waitDefaultSA()
	ctx := context.Background()
	rc := "airlock"
	// The page comes from a ConfigMap volume; /scratch is an emptyDir.
	if _, err := c.client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "site"},
		Data: map[string]string{"index.html": "served from the box\n"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Its port 8000 is published on the node (127.0.0.1) as hostPort.
	hostPort := freeTCPPort(t)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.PodSpec{RuntimeClassName: &rc, RestartPolicy: corev1.RestartPolicyNever,
			Volumes: []corev1.Volume{
				{Name: "site", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "site"}}}},
				{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			Containers: []corev1.Container{{Name: "main", Image: "python:slim",
				Command:      []string{"sh", "-c", "cd /srv && exec python3 -m http.server 8000"},
				Ports:        []corev1.ContainerPort{{ContainerPort: 8000, HostPort: int32(hostPort)}},
				VolumeMounts: []corev1.VolumeMount{{Name: "site", MountPath: "/srv"}, {Name: "scratch", MountPath: "/scratch"}}}}},
	}
	// A pod that fails once, leaving a file in its emptyDir, and
	// succeeds when restarted (restartPolicy OnFailure: a new boot of its
	// box) and finds the file.
	again := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "again"},
		Spec: corev1.PodSpec{RuntimeClassName: &rc, RestartPolicy: corev1.RestartPolicyOnFailure,
			Volumes: []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			Containers: []corev1.Container{{Name: "main", Image: "python:slim",
				Command:      []string{"sh", "-c", "if [ -e /scratch/ran ]; then echo kept; exit 0; fi; touch /scratch/ran; exit 1"},
				VolumeMounts: []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}}}}},
	}
	if _, err := c.client.CoreV1().Pods("default").Create(ctx, again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if _, err := c.client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 120*time.Second, func() string {
		p, err := c.client.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if p.Status.Phase != corev1.PodRunning {
			return "phase " + string(p.Status.Phase)
		}
		return ""
	})
	t.Logf("pod create → Running (VM): %s", time.Since(t0).Round(time.Millisecond))

	t0 = time.Now()
	if out, code := c.kubectlExit("", "exec", "web", "--", "python3", "-c", "import sys; print(6*7); sys.stdout.flush()"); code != 0 || out != "42\n" {
		t.Errorf("kubectl exec python3: exit %d, %q", code, out)
	}
	t.Logf("kubectl exec python3 (VM): %s", time.Since(t0).Round(time.Millisecond))
	if out, code := c.kubectlExit("", "exec", "web", "--", "sh", "-c", "exit 3"); code != 3 {
		t.Errorf("kubectl exec sh -c 'exit 3': exit %d, %q", code, out)
	}
	if out, code := c.kubectlExit("", "exec", "web", "--", "stat", "-c", "%a %F", "/scratch", "/srv/index.html"); code != 0 || out != "777 directory\n644 regular file\n" {
		t.Errorf("the pod's volumes in its box: exit %d, %q", code, out)
	}
	if p, err := c.client.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{}); err != nil {
		t.Error(err)
	} else if p.Status.PodIP != "127.0.0.1" {
		t.Errorf("podIP %q: want the node's IP (127.0.0.1)", p.Status.PodIP)
	}
	eventually(t, 120*time.Second, func() string {
		p, err := c.client.CoreV1().Pods("default").Get(ctx, "again", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if p.Status.Phase != corev1.PodSucceeded || len(p.Status.ContainerStatuses) != 1 {
			return "pod again: phase " + string(p.Status.Phase)
		}
		if n := p.Status.ContainerStatuses[0].RestartCount; n != 1 {
			t.Fatalf("pod again: restartCount %d, want 1", n)
		}
		return ""
	})
	if out := c.kubectl("logs", "again"); out != "kept\n" {
		t.Errorf("the restarted container's emptyDir: logs %q", out)
	}

	// The server listens a moment after the pod runs; kubectl
	// port-forward gives up on its first refused connection (as with a
	// kubelet), so wait for it inside the box first.
	eventually(t, 60*time.Second, func() string {
		out, code := c.kubectlExit("", "exec", "web", "--", "python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/')")
		if code != 0 {
			return "the box's http.server: " + out
		}
		return ""
	})
	pf := c.kubectlCmd("port-forward", "pod/web", ":8000")
	var pfOut syncBuffer
	pf.Stdout, pf.Stderr = &pfOut, &pfOut
	if err := pf.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		pf.Process.Kill()
		pf.Wait()
	}()
	var local string
	re := regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) -> 8000`)
	eventually(t, 20*time.Second, func() string {
		m := re.FindStringSubmatch(pfOut.String())
		if m == nil {
			return "kubectl port-forward: " + pfOut.String()
		}
		local = m[1]
		return ""
	})
	t0 = time.Now()
	hc := &http.Client{Timeout: 10 * time.Second}
	eventually(t, 30*time.Second, func() string {
		resp, err := hc.Get("http://127.0.0.1:" + local + "/index.html")
		if err != nil {
			return err.Error() + "; port-forward says " + pfOut.String()
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if string(b) != "served from the box\n" {
			return resp.Status + " " + string(b)
		}
		return ""
	})
	t.Logf("GET through kubectl port-forward (VM): %s", time.Since(t0).Round(time.Millisecond))

	// The published hostPort reaches the box's server; a change of the
	// ConfigMap reaches the page it serves.
	get := func(want string) func() string {
		return func() string {
			resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/index.html", hostPort))
			if err != nil {
				return "GET through the published port: " + err.Error()
			}
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			if string(b) != want {
				return "GET through the published port: " + resp.Status + " " + string(b)
			}
			return ""
		}
	}
	eventually(t, 30*time.Second, get("served from the box\n"))
	cm, err := c.client.CoreV1().ConfigMaps("default").Get(ctx, "site", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["index.html"] = "changed in the ConfigMap\n"
	if _, err := c.client.CoreV1().ConfigMaps("default").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	eventually(t, 60*time.Second, get("changed in the ConfigMap\n"))
	t.Logf("ConfigMap update → served by the box (VM): %s", time.Since(t0).Round(time.Millisecond))
}
