//go:build linux

package agent

import (
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
)

// rndAddEntropy is RNDADDENTROPY, _IOW('R', 0x03, int[2]) (linux/random.h).
const rndAddEntropy = 0x40085203

// Restored makes a guest restored from a memory snapshot its own: the
// host's entropy goes into the kernel RNG (credited, so that the pool is
// reseeded at once and /dev/urandom and getrandom differ between boxes
// restored from one snapshot), the wall clock is stepped to the host's
// time (it lags by as long as the snapshot was stored) and the hostname is
// set. Errors are reported in the reply's absence: each step is tried.
func (s *Server) Restored(req *agentpb.RestoredRequest) (*agentpb.RestoredResponse, error) {
	if e := req.Entropy; len(e) > 0 {
		if len(e) > agentpb.MaxRestoredEntropy {
			e = e[:agentpb.MaxRestoredEntropy]
		}
		if err := addEntropy(e); err != nil {
			return nil, err
		}
	}
	var resp agentpb.RestoredResponse
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

// addEntropy mixes b into the kernel's entropy pool, credited at 8 bits a
// byte (RNDADDENTROPY needs CAP_SYS_ADMIN: the agent is root).
func addEntropy(b []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	buf := make([]byte, 8+(len(b)+3)/4*4)
	*(*int32)(unsafe.Pointer(&buf[0])) = int32(len(b) * 8)
	*(*int32)(unsafe.Pointer(&buf[4])) = int32(len(b))
	copy(buf[8:], b)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), rndAddEntropy, uintptr(unsafe.Pointer(&buf[0]))); errno != 0 {
		return os.NewSyscallError("ioctl RNDADDENTROPY", errno)
	}
	return nil
}
