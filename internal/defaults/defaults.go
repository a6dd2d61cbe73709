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
package defaults

import (
	"os"
	"path/filepath"
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
)

// NetHelper returns $AIRLOCK_NET_HELPER.
func NetHelper() string { return os.Getenv(NetHelperEnv) }

// DNSUpstream returns $AIRLOCK_DNS_UPSTREAM.
func DNSUpstream() string { return os.Getenv(DNSUpstreamEnv) }

// NetTestInternet returns $AIRLOCK_NET_TEST_INTERNET, a test-only setting
// (see netstack.TestInternetEnv).
func NetTestInternet() string { return os.Getenv(NetTestInternetEnv) }
