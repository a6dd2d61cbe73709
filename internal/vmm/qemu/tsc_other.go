//go:build !amd64

package qemu

// hostTSCkHz is unknown on hosts that are not x86-64.
func hostTSCkHz() uint64 { return 0 }
