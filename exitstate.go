package airlock

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/airlock-run/airlock/internal/exitrec"
	"github.com/airlock-run/airlock/internal/store"
	"github.com/airlock-run/airlock/internal/vmm"
)

// ExitReason is why a box's boot ended (ExitState.Reason).
type ExitReason string

// Why a box stopped (ExitState.Reason).
const (
	// ExitStopped: Stop (or airlock stop) shut the box down.
	ExitStopped ExitReason = "stopped"
	// ExitExited: the box's main command ended; ExitCode is its status.
	ExitExited ExitReason = "exited"
	// ExitOOMKilled: the guest kernel's OOM killer killed the main command.
	ExitOOMKilled ExitReason = "oom-killed"
	// ExitVMDied: the VM ended on its own (QEMU killed, guest kernel panic,
	// guest out of memory); Cause says which.
	ExitVMDied ExitReason = "vm-died"
)

// ExitState says how a box's last boot ended. The zero value (Reason "")
// means no end was recorded (the box is running, was never started, or
// stopped before airlock recorded reasons).
type ExitState struct {
	// Reason is ExitStopped, ExitExited, ExitOOMKilled or ExitVMDied.
	Reason ExitReason `json:"reason"`
	// ExitCode is the main command's exit status (ExitExited,
	// ExitOOMKilled: 137); 0 otherwise. A main command that SIGKILL ended
	// in a boot where the guest's OOM killer killed a process is taken to
	// be its victim (ExitOOMKilled).
	ExitCode int `json:"exit_code"`
	// Cause is why the VM died, in words (ExitVMDied).
	Cause string `json:"cause,omitempty"`
	// Finished is when the end was recorded.
	Finished time.Time `json:"finished"`
	// Boot is the start time of the boot this ends (BoxInfo.Started): a
	// record of an earlier boot does not describe the current one.
	Boot time.Time `json:"boot"`
}

// String is the state in words: "exited (5)", "OOM killed", "VM died:
// <cause>" or "stopped".
func (e ExitState) String() string {
	switch e.Reason {
	case ExitExited:
		return fmt.Sprintf("exited (%d)", e.ExitCode)
	case ExitOOMKilled:
		return "OOM killed"
	case ExitVMDied:
		return "VM died: " + e.Cause
	case ExitStopped:
		return "stopped"
	}
	return ""
}

// recordExit records how the boot that started at boot ended, unless an
// end of that boot is already recorded (exitrec.Record: the first reason
// wins).
func recordExit(home, id string, boot time.Time, e ExitState) {
	exitrec.Record(filepath.Join(home, "boxes", id), boot,
		exitrec.State{Reason: string(e.Reason), ExitCode: e.ExitCode, Cause: e.Cause, Finished: e.Finished})
}

// ExitState returns how the box's last boot ended; ok is false when no end
// is recorded for it (it is running, or never ran).
//
// Deprecated: use BoxInfo.Exit.
func (r *Runtime) ExitState(info BoxInfo) (e ExitState, ok bool) {
	if x := r.exitOf(info); x != nil {
		return *x, true
	}
	return ExitState{}, false
}

// exitOf returns how the boot of info ended (nil: running, never ran, or
// not recorded).
func (r *Runtime) exitOf(info BoxInfo) *ExitState {
	if info.State == BoxRunning {
		return nil
	}
	if s, ok := exitrec.Read(filepath.Join(r.opts.Home, "boxes", info.ID), info.Started); ok {
		return &ExitState{Reason: ExitReason(s.Reason), ExitCode: s.ExitCode, Cause: s.Cause, Finished: s.Finished, Boot: s.Boot}
	}
	return nil
}

// recordMainExit records that the box's main command (ExecOptions.Main)
// ended with res: "exited (N)", or "OOM killed" when the guest's OOM
// killer took it; a no-op when the end of the current boot is already
// recorded.
func (b *Box) recordMainExit(ctx context.Context, res *ExecResult) {
	info, err := b.Info(ctx)
	if err != nil || res == nil {
		return
	}
	e := ExitState{Reason: ExitExited, ExitCode: res.ExitCode}
	// The agent reports an OOM kill in the exec's cgroup; the guest-wide
	// check covers an agent too old to say.
	if res.OOMKilled || (res.Signal == 9 && b.oomKilled(ctx)) {
		e.Reason = ExitOOMKilled
	}
	recordExit(b.r.opts.Home, b.id, info.Started, e)
}

// oomKilled reports whether the guest's OOM killer has killed a process
// in this boot: its oom_kill counter (/proc/vmstat) or the kernel log
// (dmesg), read in the box, or its console. A main command killed by SIGKILL in such a boot is taken
// to be the OOM killer's victim.
func (b *Box) oomKilled(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	run := func(cmd string, args ...string) (string, error) {
		res, err := b.Exec(ctx, cmd, args, ExecOptions{User: "0"})
		if err != nil {
			return "", err
		}
		return string(res.Stdout), nil
	}
	return exitrec.OOMKilled(run, func() string { return vmm.ConsoleTail(b.ConsoleLog(), 400) })
}

// recordGone records that rec's machine is gone although its record says
// running: it died on its own (a Stop records its reason first), for the
// reason its console gives.
func (r *Runtime) recordGone(rec *store.Box) {
	spec := vmm.Spec{ID: rec.ID, Dir: filepath.Join(r.opts.Home, "boxes", rec.ID)}
	d := r.drv.Attach(spec, handleOf(rec)).Death()
	recordExit(r.opts.Home, rec.ID, rec.Started, ExitState{Reason: ExitVMDied, Cause: d.Cause})
}

// Hostname returns the box's host name: BoxOptions.Hostname, else its
// name when that is a valid host name, else its id.
func (b *Box) Hostname() string { return hostname(b.snapshot()) }
