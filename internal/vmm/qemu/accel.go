// Package qemu runs a box's VM: a QEMU microvm (-M microvm) with direct
// kernel boot, virtio-mmio devices, the agent's virtio-serial port and QMP.
// It builds the command line (pure, testable), launches QEMU detached from
// the calling process (-daemonize), watches it, and stops it.
package qemu

import (
	"fmt"
	"os"
	"strings"
)

// Accelerators.
const (
	AccelKVM = "kvm"
	AccelTCG = "tcg"
)

// TCGWarning is the warning (plain text, one line) for a box that runs
// under software emulation that the user did not ask for.
const TCGWarning = "KVM is not usable here (see airlock doctor): boxes run under TCG software emulation, slower and without a hardware VM boundary"

// AccelChoice is the outcome of ProbeAccel.
type AccelChoice struct {
	Accel string // AccelKVM or AccelTCG
	// Reason says why KVM is not used (empty when it is).
	Reason string
	// Forced is true when AIRLOCK_ACCEL chose the accelerator.
	Forced bool
}

// kvmProblem returns why KVM cannot boot a stock guest kernel here, or "".
func kvmProblem() string {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return fmt.Sprintf("cannot open /dev/kvm: %v", err)
	}
	f.Close()
	if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
		return "/dev/kvm is provided by PVM (kvm_pvm): stock guest kernels cannot boot under it"
	}
	b, err := os.ReadFile("/proc/cpuinfo")
	if err == nil && !strings.Contains(string(b), " vmx") && !strings.Contains(string(b), " svm") {
		return "the CPU exposes no hardware virtualization (no vmx/svm flag in /proc/cpuinfo)"
	}
	return ""
}

// ProbeAccel chooses the accelerator: the value of force ("kvm", "tcg", or
// "" / "auto" to probe; normally $AIRLOCK_ACCEL). Probing picks KVM when
// /dev/kvm is usable with hardware virtualization and TCG otherwise.
// Forcing "kvm" where it cannot work is an error that says why.
func ProbeAccel(force string) (AccelChoice, error) {
	switch strings.ToLower(strings.TrimSpace(force)) {
	case "", "auto":
		if p := kvmProblem(); p != "" {
			return AccelChoice{Accel: AccelTCG, Reason: p}, nil
		}
		return AccelChoice{Accel: AccelKVM}, nil
	case AccelTCG:
		return AccelChoice{Accel: AccelTCG, Reason: "AIRLOCK_ACCEL=tcg", Forced: true}, nil
	case AccelKVM:
		if p := kvmProblem(); p != "" {
			return AccelChoice{}, fmt.Errorf("AIRLOCK_ACCEL=kvm but KVM cannot run boxes here: %s; unset AIRLOCK_ACCEL (or set it to tcg) to use software emulation", p)
		}
		return AccelChoice{Accel: AccelKVM, Forced: true}, nil
	default:
		return AccelChoice{}, fmt.Errorf("AIRLOCK_ACCEL=%q: want kvm, tcg or auto", force)
	}
}
