//go:build linux

package agent

import (
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
)

// ioctls of linux/random.h: RNDADDENTROPY, _IOW('R', 0x03, int[2]), and
// RNDRESEEDCRNG, _IO('R', 0x07).
const (
	rndAddEntropy = 0x40085203
	rndReseedCRNG = 0x5207
)

// Restored makes a guest restored from a memory snapshot its own: the
// host's entropy goes into the kernel RNG and the RNG is reseeded from it
// at once (a kernel whose RNG is ready reseeds only every minute or so by
// itself), so that /dev/urandom and getrandom differ between boxes
// restored from one snapshot from their first read; the wall clock is stepped to the host's
// time (it lags by as long as the snapshot was stored) and the hostname is
// set; then the processes frozen for the snapshot (Freeze) run again. The
// first step that fails ends the call with its error (the processes run
// again all the same). An agent on the host (Config.OnHost) touches
// neither the RNG nor the clock: they are the host's.
func (s *Server) Restored(req *agentpb.RestoredRequest) (*agentpb.RestoredResponse, error) {
	// Processes frozen for the snapshot (Freeze) run again once the RNG
	// is reseeded and the clock stepped.
	defer s.thaw()
	var resp agentpb.RestoredResponse
	if s.cfg.OnHost {
		return &resp, nil
	}
	if e := req.Entropy; len(e) > 0 {
		if len(e) > agentpb.MaxRestoredEntropy {
			e = e[:agentpb.MaxRestoredEntropy]
		}
		if err := reseed(e); err != nil {
			return nil, err
		}
	}
	if req.UnixNs > 0 {
		now := time.Now().UnixNano()
		ts := unix.NsecToTimespec(req.UnixNs)
		if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
			return nil, os.NewSyscallError("clock_settime", err)
		}
		resp.StepNs = req.UnixNs - now
	}
	if req.Hostname != "" && s.cfg.SetHostname != nil {
		s.cfg.SetHostname(req.Hostname)
	}
	return &resp, nil
}

// reseed mixes b into the kernel's entropy pool, credited at 8 bits a
// byte (nothing when b is empty), and reseeds the kernel's CRNG from the
// pool (both ioctls need CAP_SYS_ADMIN: the agent is root).
func reseed(b []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if len(b) > 0 {
		// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
		buf := make([]byte, 8+(len(b)+3)/4*4)
		*(*int32)(unsafe.Pointer(&buf[0])) = int32(len(b) * 8)
		*(*int32)(unsafe.Pointer(&buf[4])) = int32(len(b))
		copy(buf[8:], b)
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), rndAddEntropy, uintptr(unsafe.Pointer(&buf[0]))); errno != 0 {
			return os.NewSyscallError("ioctl RNDADDENTROPY", errno)
		}
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), rndReseedCRNG, 0); errno != 0 {
		return os.NewSyscallError("ioctl RNDRESEEDCRNG", errno)
	}
	return nil
}
