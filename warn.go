package airlock

import "github.com/airlock-run/airlock/internal/vmm"

// warn sends msg to Options.Warn, once per Runtime ("" is not sent).
func (r *Runtime) warn(msg string) {
	r.mu.Lock()
	seen := r.warned[msg]
	r.warned[msg] = true
	r.mu.Unlock()
	if !seen && msg != "" {
		r.opts.Warn(msg)
	}
}

// warnBoot passes on, once per Runtime, what the driver says the user
// should hear once a box has booted (a box just started under TCG that
// AIRLOCK_ACCEL did not ask for; the kernel fallback). A failed start
// warns of nothing.
func (r *Runtime) warnBoot() {
	br, ok := r.drv.(vmm.BootReporter)
	if !ok {
		return
	}
	b, err := br.BootInfo()
	if err != nil {
		return
	}
	for _, w := range b.Warnings {
		r.warn(w)
	}
}
