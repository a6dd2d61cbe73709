// Package defaults is the one place airlock's library code reads the
// environment: the default directories and settings that Options fields
// left empty take. Every other library package gets its configuration
// passed in. (The CLI and the tests read their own variables.)
//
//	AIRLOCK_HOME    box records and directories   default ~/.airlock
//	AIRLOCK_IMAGES  local image store             default $AIRLOCK_HOME/images
//	AIRLOCK_CACHE   kernels, agent disks, bases   default ${XDG_CACHE_HOME:-~/.cache}/airlock
//	AIRLOCK_ACCEL   kvm, tcg or auto              default auto
//	AIRLOCK_KERNEL  guest kernel to boot          default: found in the cache
//	AIRLOCK_AGENT   guest agent binary            default: beside the executable, or on PATH
//	AIRLOCK_THP     on, code or off               default: per kernel and accelerator
//	AIRLOCK_DEBUG   non-empty: verbose guest boot logs
//	AIRLOCK_VOLUME_TRANSPORT  9p or virtiofs  default 9p
//	AIRLOCK_VIRTIOFSD  virtiofsd binary      default /usr/lib/qemu/virtiofsd, /usr/libexec, PATH
//
// Without $HOME (and without the AIRLOCK_* variable) Home and Cache are ""
// rather than a directory under /tmp; airlock.Open then says what to set.
//
//	AIRLOCK_NET_HELPER    network helper binary  default: airlock-net beside the executable, or on PATH
//	AIRLOCK_DNS_UPSTREAM  boxes' DNS resolver    default: the host's first nameserver (/etc/resolv.conf)
//	AIRLOCK_NET_TEST_INTERNET  tests only: a /24 the network helper reaches on 127.0.0.0/24
//
// Confinement and host capacity (docs/confinement.md):
//
//	AIRLOCK_CONFINE      off (or 0, false): box QEMUs run unconfined    default on
//	AIRLOCK_CONSOLE_MAX  cap of a confined box's console log, bytes     default 8 MiB
//	AIRLOCK_CPU_LIMIT    host CPUs one box's QEMU may use (cgroup)      default no limit
//	AIRLOCK_UID_RANGE    START:COUNT of uids for box QEMUs (as root)    default /etc/subuid's "airlock"
//	AIRLOCK_MAX_BOXES    cap on boxes running on this host              default 128
//	AIRLOCK_MAX_MEMORY   cap on their memory (guest + overhead), MiB    default host RAM minus a reserve
package defaults

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Home returns $AIRLOCK_HOME, else ~/.airlock; "" when neither AIRLOCK_HOME
// nor HOME is set. There is no shared fallback such as /tmp, where another
// user could plant files: callers report the missing setting.
func Home() string {
	if h := os.Getenv("AIRLOCK_HOME"); h != "" {
		return h
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".airlock")
}

// Images returns $AIRLOCK_IMAGES, else Home()/images.
func Images() string { return ImagesIn(Home()) }

// ImagesIn returns $AIRLOCK_IMAGES, else home/images ("" when home is "").
func ImagesIn(home string) string {
	if d := os.Getenv("AIRLOCK_IMAGES"); d != "" {
		return d
	}
	if home == "" {
		return ""
	}
	return filepath.Join(home, "images")
}

// Cache returns $AIRLOCK_CACHE, else $XDG_CACHE_HOME/airlock, else
// ~/.cache/airlock; "" when none of AIRLOCK_CACHE, XDG_CACHE_HOME and HOME
// is set (no shared fallback such as /tmp, where another user could plant
// a kernel or agent disk). Everything in it can be rebuilt.
func Cache() string {
	if d := os.Getenv("AIRLOCK_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "airlock")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".cache", "airlock")
}

// Accel returns $AIRLOCK_ACCEL.
func Accel() string { return os.Getenv("AIRLOCK_ACCEL") }

// Kernel returns $AIRLOCK_KERNEL.
func Kernel() string { return os.Getenv("AIRLOCK_KERNEL") }

// Agent returns $AIRLOCK_AGENT.
func Agent() string { return os.Getenv("AIRLOCK_AGENT") }

// THP returns $AIRLOCK_THP.
func THP() string { return os.Getenv("AIRLOCK_THP") }

// VolumeTransport returns $AIRLOCK_VOLUME_TRANSPORT.
func VolumeTransport() string { return os.Getenv("AIRLOCK_VOLUME_TRANSPORT") }

// Virtiofsd returns $AIRLOCK_VIRTIOFSD.
func Virtiofsd() string { return os.Getenv("AIRLOCK_VIRTIOFSD") }

// Debug reports whether AIRLOCK_DEBUG is set.
func Debug() bool { return os.Getenv("AIRLOCK_DEBUG") != "" }

// Socket returns $AIRLOCK_SOCKET: the unix socket of `airlock serve`
// ("" = the home's airlock.sock).
func Socket() string { return os.Getenv("AIRLOCK_SOCKET") }

// Token returns $AIRLOCK_TOKEN: the bearer token of `airlock serve`'s TCP
// listeners ("" = the one stored in the home).
func Token() string { return os.Getenv("AIRLOCK_TOKEN") }

// Names of the network helper's environment variables.
const (
	NetHelperEnv       = "AIRLOCK_NET_HELPER"
	DNSUpstreamEnv     = "AIRLOCK_DNS_UPSTREAM"
	NetTestInternetEnv = "AIRLOCK_NET_TEST_INTERNET"
	// ExtraCAEnv names a PEM file of CA certificates that the network
	// helper trusts, besides the host's roots, when it verifies the real
	// host of a connection it intercepts to substitute a box's secrets
	// (private endpoints, tests).
	ExtraCAEnv = "AIRLOCK_EXTRA_CA"
)

// ExtraCA returns $AIRLOCK_EXTRA_CA (see ExtraCAEnv).
func ExtraCA() string { return os.Getenv(ExtraCAEnv) }

// NetHelper returns $AIRLOCK_NET_HELPER.
func NetHelper() string { return os.Getenv(NetHelperEnv) }

// DNSUpstream returns $AIRLOCK_DNS_UPSTREAM.
func DNSUpstream() string { return os.Getenv(DNSUpstreamEnv) }

// NetTestInternet returns $AIRLOCK_NET_TEST_INTERNET, a test-only setting
// (see netstack.TestInternetEnv).
func NetTestInternet() string { return os.Getenv(NetTestInternetEnv) }

// Unconfined reports whether AIRLOCK_CONFINE is off, 0 or false.
func Unconfined() bool {
	v := strings.ToLower(os.Getenv("AIRLOCK_CONFINE"))
	return v == "off" || v == "0" || v == "false"
}

// ConsoleMax returns $AIRLOCK_CONSOLE_MAX in bytes (0 when unset).
func ConsoleMax() (int64, error) {
	v := os.Getenv("AIRLOCK_CONSOLE_MAX")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 4096 {
		return 0, fmt.Errorf("AIRLOCK_CONSOLE_MAX=%q: want the console log's cap in bytes, 4096 or more", v)
	}
	return n, nil
}

// CPULimit returns $AIRLOCK_CPU_LIMIT, host CPUs (0 when unset).
func CPULimit() (float64, error) {
	v := os.Getenv("AIRLOCK_CPU_LIMIT")
	if v == "" {
		return 0, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 {
		return 0, fmt.Errorf("AIRLOCK_CPU_LIMIT=%q: want a number of host CPUs, e.g. 1.5", v)
	}
	return f, nil
}

// UIDRange returns $AIRLOCK_UID_RANGE (START:COUNT, checked by its user).
func UIDRange() string { return os.Getenv("AIRLOCK_UID_RANGE") }

// MaxBoxes returns $AIRLOCK_MAX_BOXES (0 when unset).
func MaxBoxes() (int, error) {
	v := os.Getenv("AIRLOCK_MAX_BOXES")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("AIRLOCK_MAX_BOXES=%q: want a number of boxes, 1 or more", v)
	}
	return n, nil
}

// MaxMemory returns $AIRLOCK_MAX_MEMORY in MiB (0 when unset).
func MaxMemory() (int, error) {
	v := os.Getenv("AIRLOCK_MAX_MEMORY")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 64 {
		return 0, fmt.Errorf("AIRLOCK_MAX_MEMORY=%q: want MiB, 64 or more", v)
	}
	return n, nil
}

// BaseChildEnv are the variables of this process's environment every
// helper process next to a box keeps (see ChildEnv): the search path and
// the locale and time zone, none of them a secret. LC_* matches every
// locale category.
var BaseChildEnv = []string{"PATH", "LANG", "LANGUAGE", "LC_*", "TZ"}

// GoRuntimeEnv are the Go runtime's settings, which a helper written in
// Go (the launcher stage, the network helper) keeps.
var GoRuntimeEnv = []string{"GODEBUG", "GOGC", "GOMAXPROCS", "GOMEMLIMIT", "GOTRACEBACK"}

// ChildEnv returns the environment for a process that runs next to a box
// and that a hostile guest may take over (QEMU, the network helper,
// virtiofsd, the e2fsprogs a commit runs on the box's disk): of this
// process's environment only BaseChildEnv and the variables named in keep
// (a trailing * matches a prefix). Everything else, AIRLOCK_TOKEN and API
// keys included, stays out: code in such a process can read its own
// /proc/self/environ.
func ChildEnv(keep ...string) []string { return FilterEnv(os.Environ(), keep...) }

// FilterEnv returns the entries of environ ("NAME=value") whose name is
// in BaseChildEnv or keep (a trailing * matches a prefix), in their order.
func FilterEnv(environ []string, keep ...string) []string {
	out := []string{}
	for _, e := range environ {
		name, _, ok := strings.Cut(e, "=")
		if !ok || name == "" {
			continue
		}
		if envNameIn(name, BaseChildEnv) || envNameIn(name, keep) {
			out = append(out, e)
		}
	}
	return out
}

func envNameIn(name string, pats []string) bool {
	for _, p := range pats {
		if pre, ok := strings.CutSuffix(p, "*"); ok {
			if strings.HasPrefix(name, pre) {
				return true
			}
		} else if name == p {
			return true
		}
	}
	return false
}
