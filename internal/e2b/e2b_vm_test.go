package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/netstack"
	"github.com/airlock-run/airlock/internal/server"
	"github.com/airlock-run/airlock/internal/vmtest"
)

func TestMain(m *testing.M) { os.Exit(vmtest.Main(m)) }

// dataImage is the image with matplotlib the code interpreter's template
// maps to (hack/setup.sh builds it).
const dataImage = "airlock/python-data"

// serveForSDK serves the E2B API on loopback over a fresh home, behind
// the REST server's policy and exec slots as airlock serve --e2b wires it,
// and returns the environment E2B's SDKs need (E2B_API_URL,
// E2B_SANDBOX_URL, E2B_API_KEY) and whether the data image is there, and
// the runtime.
func serveForSDK(t *testing.T) ([]string, *airlock.Runtime) {
	// A stand-in for an internet server, on loopback: boxes reach
	// 127.0.0.2:PORT as 198.18.0.2:PORT (netstack.TestInternetEnv), so
	// that the egress cases send nothing off the host.
	t.Setenv(netstack.TestInternetEnv, "198.18.0.0/24")
	probe := reachable(t, "127.0.0.2:0")
	probe2 := reachable(t, "127.0.0.3:0")
	rt, err := airlock.Open(airlock.Options{Home: t.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		boxes, _ := rt.List(context.Background())
		for _, b := range boxes {
			rt.Remove(context.Background(), b.ID, true)
		}
		rt.Close()
	})
	env := os.Environ()
	templates := map[string]string{}
	if st, err := vmtest.OpenImages(); err == nil {
		if _, err := st.Resolve(dataImage); err == nil {
			env = append(env, "AIRLOCK_E2B_DATA_IMAGE=1")
		} else {
			t.Logf("%s is not in the image store: code-interpreter-v1 is %s here, the chart case skips", dataImage, airlock.DefaultImage)
			templates["code-interpreter-v1"] = airlock.DefaultImage
		}
		if _, err := st.Resolve(vmtest.NetClientsImage); err == nil {
			env = append(env, "AIRLOCK_E2B_NODE_IMAGE="+vmtest.NetClientsImage)
		} else {
			t.Logf("%s is not in the image store: the JavaScript context case skips", vmtest.NetClientsImage)
		}
	}
	b := make([]byte, 16)
	rand.Read(b)
	token := hex.EncodeToString(b)
	srv := server.New(server.Config{Runtime: rt, Token: token})
	es, err := New(Config{Runtime: rt, Token: token, Templates: templates, CheckBox: srv.CheckBox, PullContext: srv.PullContext,
		CheckStart: srv.CheckStart, CheckSuspend: srv.CheckSuspend, CheckSnapshot: srv.CheckSnapshot, CheckFork: srv.CheckFork, CheckNetwork: srv.CheckNetwork,
		AcquireExec: func(ctx context.Context) (func(), error) { return srv.AcquireExec(ctx, server.E2BClient) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { es.Close() })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	hs := &http.Server{Handler: es.Handler(), Protocols: &protos, ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(l)
	t.Cleanup(func() { hs.Close() })
	url := "http://" + l.Addr().String()
	env = append(env, "AIRLOCK_E2B_NET_PROBE=198.18.0.2:"+strconv.Itoa(probe), "AIRLOCK_E2B_NET_PROBE2=198.18.0.3:"+strconv.Itoa(probe2))
	return append(env, "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "E2B_API_KEY=e2b_"+token, "E2B_DOMAIN=airlock.invalid"), rt
}

// reachable listens on addr and writes "reachable" to each connection,
// then closes it; it returns the port.
func reachable(t *testing.T, addr string) int {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.SetDeadline(time.Now().Add(10 * time.Second))
			c.Write([]byte("reachable"))
			c.Close()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// TestE2BSDK runs E2B's own Python SDKs (e2b, e2b-code-interpreter, as
// installed from the package index into sdk/python/.venv by
// hack/setup.sh) against this package: testdata/test_e2b_sdk.py, one
// sandbox (one box) for all its cases.
func TestE2BSDK(t *testing.T) {
	vmtest.Require(t)
	py, err := filepath.Abs("../../sdk/python/.venv/bin/python")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(py, "-c", "import e2b, e2b_code_interpreter, pytest").CombinedOutput(); err != nil {
		t.Skipf("E2B's SDKs are not installed in sdk/python/.venv (run hack/setup.sh): %v: %s", err, out)
	}
	env, rt := serveForSDK(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	args := []string{"-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=8", "testdata/test_e2b_sdk.py"}
	if k := os.Getenv("AIRLOCK_E2B_PYTEST_K"); k != "" {
		args = append(args, "-k", k) // a developer's run of some cases
	}
	cmd := exec.CommandContext(ctx, py, args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	t.Logf("pytest testdata/test_e2b_sdk.py:\n%s", out)
	if err != nil {
		t.Fatalf("the E2B SDK cases failed: %v", err)
	}
	if slices.Contains(env, "AIRLOCK_E2B_NODE_IMAGE="+vmtest.NetClientsImage) && os.Getenv("AIRLOCK_E2B_PYTEST_K") == "" {
		// The JavaScript case's sandbox mounted volume e2b-vol: a named
		// volume of the home, kept when the sandbox was killed.
		vols, err := rt.Volumes(ctx)
		if err != nil || !slices.ContainsFunc(vols, func(v airlock.VolumeInfo) bool { return v.Name == "e2b-vol" && len(v.UsedBy) == 0 }) {
			t.Errorf("volumes after the SDK cases: %+v, %v; want e2b-vol, used by no box", vols, err)
		}
	}
}

// TestE2BNodeSDK runs E2B's own Node SDKs (e2b, @e2b/code-interpreter,
// pinned in testdata/node, installed by hack/setup.sh) against this
// package: testdata/node/sdk.test.mjs, one sandbox for all its cases.
func TestE2BNodeSDK(t *testing.T) {
	vmtest.Require(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed (hack/setup.sh installs it)")
	}
	if _, err := os.Stat("testdata/node/node_modules/@e2b/code-interpreter"); err != nil {
		t.Skip("E2B's Node SDKs are not installed in internal/e2b/testdata/node (run hack/setup.sh)")
	}
	env, _ := serveForSDK(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec", "sdk.test.mjs")
	cmd.Dir = "testdata/node"
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	t.Logf("node --test sdk.test.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("the E2B Node SDK cases failed: %v", err)
	}
}
