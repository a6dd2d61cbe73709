//go:build airlock_testfaults

package airlock

import "sync/atomic"

// slirpForBench, set only by the network benchmark in builds with the
// airlock_testfaults tag, gives boxes QEMU's user-mode networking (slirp)
// instead of the helper, to compare the two. It is not a user option and
// not in release builds: slirp lets a box reach the host's loopback.
var slirpForBench atomic.Bool

// benchSlirp reports whether boxes get slirp instead of the helper.
func benchSlirp() bool { return slirpForBench.Load() }
