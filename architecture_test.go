package airlock_test

import (
	"encoding/json"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackageRules checks the import rules of docs/architecture.md: each
// package may import only the module packages listed for it (prefix
// match, "" for none), so a seam cannot be crossed by accident.
func TestPackageRules(t *testing.T) {
	const mod = "github.com/airlock-run/airlock"
	may := map[string][]string{
		// Contracts and leaves: nothing of the module, or only other contracts.
		"internal/guestabi":      {},
		"internal/boxdir":        {},
		"internal/defaults":      {},
		"internal/store":         {},
		"internal/transport":     {},
		"internal/agent/agentpb": {},
		"internal/image":         {},
		"internal/tarfs":         {},
		"internal/headtail":      {},
		"internal/measure":       {},
		// Sparse copies of disk images, for rootfs and the drivers.
		"internal/sparse": {},
		// The stored box record: its versions, encode and decode.
		"internal/boxrecord": {},
		// The host side of a box's secrets: checks, placeholders, the
		// secrets file, the helper's configuration; no Box.
		"internal/secrets": {"internal/boxdir", "internal/boxrecord", "internal/netstack"},
		"internal/boxopts": {"internal/boxrecord", "internal/guestabi", "internal/image", "internal/lifetime", "internal/netstack", "internal/secrets", "internal/volume"},
		// A snapshot's record on disk (snapshot.json), its names and flock;
		// scratch names the temporary directory a snapshot is made in.
		"internal/snapmeta": {"internal/scratch"},
		// A box's checkpoints under its directory: names, layout, the tree;
		// the root saves and restores the driver's files; a removed
		// checkpoint is folded into its children (pagediff).
		"internal/checkpoint": {"internal/checkpoint/pagediff", "internal/boundedio"},
		// Page-delta chains of fixed-size images (a checkpoint's RAM image
		// and writable layer): per-page hashes, deltas, materialising,
		// merging; the QEMU driver saves and restores with it.
		"internal/checkpoint/pagediff": {"internal/boundedio"},
		// The named volume store (ext4 images under Home/volumes).
		"internal/volume": {},
		// The tenants file of airlock serve --tenants (tokens hashed,
		// quotas, grants, reload); the server enforces them.
		"internal/tenant": {"internal/boundedio"},
		// The root package's hooks for codebox, no public API (set in an
		// init of the root package).
		"internal/friend": {},
		// Box lifetimes: deadlines, use, the reaper's loop.
		"internal/lifetime": {},
		// How a box's boot ended, in its box directory.
		"internal/exitrec": {"internal/boxdir"},
		// The warm-pool scheduler: boxes and templates come in through its
		// Factory interface; Caps, its Room, is the host caps' rules over
		// counts passed in (capacity: their arithmetic).
		"internal/pool": {"internal/capacity"},
		// The host caps' arithmetic over counts and limits: the caller
		// counts machines and boxes.
		"internal/capacity": {},
		// Scratch names that say which process made them (pid and start
		// time, read as the driver seam does).
		"internal/scratch":      {"internal/vmm"},
		"internal/image/unpack": {"internal/image"},
		"internal/rootfs":       {"internal/image", "internal/guestabi", "internal/scratch", "internal/sparse"},
		"internal/assets":       {"internal/defaults"},
		// The box archive format: hostile input read against limits its
		// caller gives; no VM driver (checks that need one are passed in).
		// scratch and snapmeta: where an import is extracted and recorded.
		"internal/boxarchive": {"internal/image", "internal/sparse", "internal/scratch", "internal/snapmeta", "internal/checkpoint"},
		// The box network: a user-mode stack in a helper process per box,
		// which knows nothing of VMs or boxes.
		"internal/netstack": {"internal/defaults"},
		"cmd/airlock-net":   {"internal/netstack"},
		// The helper's supervisor on the host (start, confine, wait, stop,
		// reconcile, control calls); vmm only for process handles.
		"internal/netstack/helper": {"internal/netstack", "internal/confine", "internal/boxdir", "internal/vmm"},
		// Confinement shared by QEMU, the network helper, virtio-fs daemons
		// and commit's disk tools: cgroups, box uids, the jail.
		"internal/confine": {"internal/confine/jailstage", "internal/defaults"},
		// The launcher stage of a confined program: the standard library
		// only (its init runs early in a re-executed program).
		"internal/confine/jailstage": {},
		"internal/agent/client":      {"internal/agent/agentpb", "internal/transport"},
		// Files in and out of a box over the agent's file calls, behind a
		// small interface over the client: no box lifecycle, no VM.
		"internal/boxfiles": {"internal/agent/client", "internal/agent/agentpb", "internal/tarfs"},
		// A box handle's view of its current boot: the machine watched,
		// the agent connection, a death, an unhealthy mark; the box comes
		// in through its Host interface.
		"internal/boxvm": {"internal/agent/client", "internal/store", "internal/vmm"},
		// The box lifecycle's engine: the sequences over the record, the
		// driver, the boot's session and the network helper; what a box
		// is, the public errors and the events come from the root.
		"internal/lifecycle": {"internal/boxdir", "internal/boxvm", "internal/store", "internal/vmm", "internal/netstack", "internal/netstack/helper", "internal/image", "internal/rootfs", "internal/scratch", "internal/boundedio", "internal/boxarchive", "internal/checkpoint", "internal/snapmeta"},
		// An exec's bounded output pipe.
		"internal/boundedpipe": {},
		// Whole-file reads under a bound (records others wrote).
		"internal/boundedio": {},
		// The host side of one exec apart from the box: environment,
		// deadlines, the wait for its end.
		"internal/execrun": {"internal/agent/client", "internal/boundedpipe"},
		// Test helper: a hostile guest agent, speaking the protocol itself.
		"internal/agent/evilagent": {"internal/agent/agentpb", "internal/transport"},
		// Guest side: never a host package.
		"internal/agent":     {"internal/agent/agentpb", "internal/transport", "internal/tarfs", "internal/headtail"},
		"internal/guestinit": {"internal/guestabi", "internal/tarfs"},
		"cmd/airlock-agent":  {"internal/agent", "internal/guestinit", "internal/guestabi", "internal/transport"},
		// The driver seam: drivers know the seam and the parts a machine
		// is made of, never the lifecycle code or the box store.
		// The seam names prepared disk files, never the image store.
		"internal/vmm":      {"internal/agent/client", "internal/guestabi"},
		"internal/vmm/fake": {"internal/vmm", "internal/agent/client", "internal/boxdir", "internal/guestabi", "internal/sparse"},
		// Test helper: the driver conformance suite, run by each driver's
		// tests; it knows only the seam.
		"internal/vmm/vmmtest": {"internal/vmm", "internal/agent/client"},
		// defaults: the allowlisted environment of QEMU and its helpers
		// (defaults.ChildEnv), never a setting.
		// No rootfs, no image store: the lifecycle code builds the disks.
		"internal/vmm/qemu": {"internal/vmm", "internal/agent/client", "internal/boxdir", "internal/guestabi", "internal/assets", "internal/sparse", "internal/defaults", "internal/confine", "internal/checkpoint/pagediff"},
		// The public API: lifecycle over the seam; no CLI, no bench.
		"":        {"internal/vmm", "internal/scratch", "internal/store", "internal/boxdir", "internal/defaults", "internal/image", "internal/rootfs", "internal/agent/client", "internal/agent/agentpb", "internal/headtail", "internal/netstack", "internal/boxarchive", "internal/confine", "internal/boxfiles", "internal/boxvm", "internal/boundedpipe", "internal/execrun", "internal/exitrec", "internal/friend", "internal/guestabi", "internal/lifetime", "internal/pool", "internal/boxrecord", "internal/snapmeta", "internal/checkpoint", "internal/volume", "internal/capacity", "internal/sparse", "internal/secrets", "internal/lifecycle", "internal/boxopts", "internal/measure"},
		"codebox": {"", "internal/friend", "internal/headtail"},
		"interp":  {"codebox"},
		// The Kubernetes node (airlock node): pods as boxes through the
		// public API only, with client-go and virtual-kubelet.
		"kubenode": {"", "internal/kubebox"},
		// The contract between airlock gateway and airlock node on the
		// cluster's objects (names, labels, annotations): a leaf.
		"internal/kubebox": {},
		// airlock gateway: airlock serve's API (internal/server with a
		// Cluster) over pods and nodes read with client-go; no box of its
		// own, so never the root package.
		"internal/gateway": {"internal/server", "internal/kubebox"},
		// E2B's API (airlock serve --e2b): the public API only, and its own
		// generated envd messages; the REST server's policy comes in as
		// functions.
		"internal/e2b":                                     {"", "codebox", "internal/e2b/envdpb", "internal/headtail"},
		"internal/e2b/envdpb/process":                      {},
		"internal/e2b/envdpb/process/processconnect":       {"internal/e2b/envdpb/process"},
		"internal/e2b/envdpb/filesystem":                   {},
		"internal/e2b/envdpb/filesystem/filesystemconnect": {"internal/e2b/envdpb/filesystem"},
	}
	out, err := osexec.Command("go", "list", "-json=ImportPath,Imports", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	seen := 0
	for dec.More() {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, mod), "/")
		allowed, ok := may[rel]
		if !ok {
			continue
		}
		seen++
		for _, imp := range p.Imports {
			if imp != mod && !strings.HasPrefix(imp, mod+"/") {
				continue
			}
			dep := strings.TrimPrefix(strings.TrimPrefix(imp, mod), "/")
			okDep := false
			for _, a := range allowed {
				if dep == a || (a != "" && strings.HasPrefix(dep, a+"/")) {
					okDep = true
				}
			}
			if !okDep {
				t.Errorf("%s imports %s, which docs/architecture.md does not allow", p.ImportPath, imp)
			}
		}
	}
	if seen != len(may) {
		t.Errorf("go list listed %d of the %d packages with rules", seen, len(may))
	}
}

// TestOnlyDefaultsReadsTheEnvironment: library packages get their
// configuration passed in; internal/defaults is the one place that reads
// the environment (interp.ConfigFromEnv is documented as doing so).
func TestOnlyDefaultsReadsTheEnvironment(t *testing.T) {
	allowed := map[string]bool{"internal/defaults": true, "interp": true}
	skip := func(dir string) bool {
		return strings.HasPrefix(dir, "internal/cli") || strings.HasPrefix(dir, "cmd") || strings.HasPrefix(dir, "examples") ||
			strings.HasSuffix(dir, "test") || strings.Contains(dir, "testdata") // test helpers: vmtest, imagetest, interptest
	}
	filepath.Walk(".", func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		dir := filepath.Dir(p)
		if dir == "." {
			dir = ""
		}
		if allowed[dir] || skip(dir) || strings.HasPrefix(p, ".git") {
			return nil
		}
		b, _ := os.ReadFile(p)
		// Not a setting: package confine and the QEMU driver mark their
		// re-executions of this program (launcher stage, console drainer,
		// disk tools) with a variable they set themselves.
		src := strings.ReplaceAll(string(b), "os.Getenv(stageEnv)", "")
		for _, f := range []string{"os.Getenv(", "os.LookupEnv("} {
			if strings.Contains(src, f) {
				t.Errorf("%s calls %s: take the setting from Options (defaults in internal/defaults)", p, f)
			}
		}
		return nil
	})
}

// TestReleaseBinariesCarryNoTestFaults builds the release binaries (the
// CLI, the guest agent, the network helper) as they ship, without the
// airlock_testfaults tag, and checks that none holds a test-only fault or
// seam (the exec wedge, the network benchmark's slirp switch, the CLI's
// fake driver) or links a test-only package.
func TestReleaseBinariesCarryNoTestFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the three release binaries")
	}
	dir := t.TempDir()
	for _, cmd := range []string{"airlock", "airlock-agent", "airlock-net"} {
		deps, err := osexec.Command("go", "list", "-deps", "./cmd/"+cmd).Output()
		if err != nil {
			t.Fatalf("go list -deps ./cmd/%s: %v", cmd, err)
		}
		for _, p := range strings.Fields(string(deps)) {
			if strings.HasSuffix(p, "/internal/vmm/fake") || strings.HasSuffix(p, "/internal/vmm/vmmtest") || strings.HasSuffix(p, "/internal/vmtest") || strings.HasSuffix(p, "/evilagent") {
				t.Errorf("%s links the test-only package %s", cmd, p)
			}
		}
		bin := filepath.Join(dir, cmd)
		build := osexec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/"+cmd)
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build ./cmd/%s: %v\n%s", cmd, err, out)
		}
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		low := strings.ToLower(string(b))
		// The faults' own names: "wedge" alone is in libraries' tables
		// (HTML entity names, linked with client-go).
		for _, s := range []string{"test_wedge_exec", "testwedgeexec", "wedgeexec", "slirpforbench", "benchslirp", "airlock_testfaults", "airlock_test_driver", "openwithtestdriver"} {
			if strings.Contains(low, s) {
				t.Errorf("release %s holds %q", cmd, s)
			}
		}
	}
}

// TestTestsIsolateTheirHome: every package whose tests can open a Runtime,
// start `airlock serve` or run the CLI (they import one of these packages,
// or are one) isolates its test binary from the user's home and image
// store in TestMain (vmtest.Main or vmtest.Isolate), so that a test that
// takes a default directory never writes into the user's.
func TestTestsIsolateTheirHome(t *testing.T) {
	const mod = "github.com/airlock-run/airlock"
	opens := map[string]bool{mod: true, mod + "/codebox": true, mod + "/interp": true,
		mod + "/internal/cli": true, mod + "/internal/server": true, mod + "/internal/mcpserver": true}
	out, err := osexec.Command("go", "list", "-json=ImportPath,Dir,TestGoFiles,XTestGoFiles,TestImports,XTestImports", "./...").Output()
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p struct {
			ImportPath, Dir           string
			TestGoFiles, XTestGoFiles []string
			TestImports, XTestImports []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		files := append(p.TestGoFiles, p.XTestGoFiles...)
		if len(files) == 0 {
			continue
		}
		needs := opens[p.ImportPath]
		for _, imp := range append(p.TestImports, p.XTestImports...) {
			needs = needs || opens[imp]
		}
		if !needs {
			continue
		}
		isolated := false
		for _, f := range files {
			b, err := os.ReadFile(filepath.Join(p.Dir, f))
			if err != nil {
				t.Fatal(err)
			}
			src := string(b)
			if strings.Contains(src, "func TestMain(") && (strings.Contains(src, "vmtest.Main(") || strings.Contains(src, "vmtest.Isolate(")) {
				isolated = true
			}
		}
		if !isolated {
			t.Errorf("%s: its tests can open a Runtime or run the CLI but no TestMain calls vmtest.Main or vmtest.Isolate: they would use the user's home and image store", p.ImportPath)
		}
	}
}

// TestOneRootFileImportsQEMU: of the root package's files, only the one
// that constructs the QEMU driver imports it; everything else goes through
// the driver seam (internal/vmm) or the shared confinement
// (internal/confine).
func TestOneRootFileImportsQEMU(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), `"github.com/airlock-run/airlock/internal/vmm/qemu"`) {
			got = append(got, f)
		}
	}
	if len(got) != 1 || got[0] != "airlock.go" {
		t.Errorf("root files importing internal/vmm/qemu: %v, want only airlock.go (which constructs the driver)", got)
	}
}
