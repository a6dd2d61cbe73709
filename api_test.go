package airlock_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/airlock-run/airlock"
)

// TestResolveOptions: ResolveOptions gives the options Create would use,
// defaults filled in, and refuses what Create refuses, naming it.
func TestResolveOptions(t *testing.T) {
	open, ref := lifeHome(t)
	r := open(0)
	ctx := context.Background()
	got, err := r.ResolveOptions(ctx, airlock.BoxOptions{Image: ref})
	if err != nil {
		t.Fatal(err)
	}
	if got.CPUs != airlock.DefaultCPUs || got.MemoryMiB != airlock.DefaultMemoryMiB || got.DiskSizeMiB != airlock.DefaultDiskSizeMiB || got.Network != airlock.NetworkPublic {
		t.Errorf("resolved defaults: %+v", got)
	}
	if got, _ := r.ResolveOptions(ctx, airlock.BoxOptions{Image: ref, AllowNet: []string{"example.com"}}); got.Network != airlock.NetworkAllowlist {
		t.Errorf("with AllowNet: network %q, want %q", got.Network, airlock.NetworkAllowlist)
	}
	for _, o := range []airlock.BoxOptions{{CPUs: airlock.MaxCPUs + 1}, {MemoryMiB: airlock.MinMemoryMiB - 1}, {DiskSizeMiB: airlock.MinDiskSizeMiB - 1}, {TTL: -1}, {Network: "internet"}} {
		o.Image = ref
		if _, err := r.ResolveOptions(ctx, o); err == nil {
			t.Errorf("ResolveOptions(%+v) accepted", o)
		} else if o.Network == "" && !errors.Is(err, airlock.ErrInvalidArgument) {
			t.Errorf("ResolveOptions(%+v): %v, want ErrInvalidArgument", o, err)
		}
	}
	if _, err := r.ResolveOptions(ctx, airlock.BoxOptions{FromSnapshot: "nope"}); !errors.Is(err, airlock.ErrSnapshotNotFound) {
		t.Errorf("restore of a missing snapshot: %v", err)
	}
}

// TestMainExecRecordsTheExit: an exec marked Main records its end as the
// box's (BoxInfo.Exit), which a later Stop does not overwrite; its output
// goes to the writers ExecOptions names; Stop takes its options.
func TestMainExecRecordsTheExit(t *testing.T) {
	open, ref := lifeHome(t)
	r := open(0)
	ctx := context.Background()
	b, err := r.Create(ctx, airlock.BoxOptions{Image: ref, Network: airlock.NetworkNone})
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	p, err := b.ExecStream(ctx, "sh", []string{"-c", "cat; echo out; echo err >&2; exit 7"},
		airlock.ExecOptions{Stdin: strings.NewReader("in\n"), Stdout: &out, Stderr: &errb, Main: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Wait()
	if err != nil || res.ExitCode != 7 {
		t.Fatalf("main exec: %+v %v", res, err)
	}
	if out.String() != "in\nout\n" || errb.String() != "err\n" {
		t.Errorf("stdout %q stderr %q, want %q %q", out.String(), errb.String(), "in\nout\n", "err\n")
	}
	info, err := b.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State != airlock.BoxRunning || info.Exit != nil {
		t.Errorf("running box: state %q exit %+v, want running and none", info.State, info.Exit)
	}
	if err := b.Stop(ctx, airlock.StopOptions{}, airlock.StopOptions{}); !errors.Is(err, airlock.ErrInvalidArgument) {
		t.Errorf("Stop with two options: %v", err)
	}
	if err := b.Stop(ctx, airlock.StopOptions{Grace: -1}); err != nil {
		t.Fatal(err)
	}
	info, err = b.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State != airlock.BoxStopped || info.Exit == nil || info.Exit.Reason != airlock.ExitExited || info.Exit.ExitCode != 7 {
		t.Errorf("after the main command's exit 7 and a stop: state %q exit %+v, want stopped, exited (7)", info.State, info.Exit)
	}
	if _, err := b.Fork(ctx, 0); !errors.Is(err, airlock.ErrInvalidArgument) {
		t.Errorf("Fork into 0: %v", err)
	}
}
