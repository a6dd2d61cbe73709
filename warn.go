package airlock

import "github.com/airlock-run/airlock/internal/vmm/qemu"

// warnAccel warns, once per Runtime, that a box just started under TCG
// although AIRLOCK_ACCEL did not ask for it, and passes on the kernel
// fallback note.
func (r *Runtime) warnAccel(boot *bootAssets) {
	r.warn(boot.note)
	if boot.accel.Accel == qemu.AccelTCG && !boot.accel.Forced {
		r.warn(qemu.TCGWarning)
	}
}
