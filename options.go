package airlock

import (
	"io"
	"time"
)

// Defaults for BoxOptions fields left zero.
const (
	DefaultImage       = "python:slim"
	DefaultCPUs        = 1
	DefaultMemoryMiB   = 512
	DefaultDiskSizeMiB = 4096
)

// BoxOptions describe a box. The zero value is a python:slim box with
// 1 vCPU, 512 MiB of RAM, a 4 GiB writable layer and network mode
// NetworkPublic (the internet, but not the host or private ranges).
type BoxOptions struct {
	// Image is an image reference in Docker syntax ("python:slim",
	// "localhost:5000/img@sha256:..."); default DefaultImage. It is taken
	// from the local store, or pulled if absent.
	Image string
	// Name is an optional unique name, usable wherever an id is.
	Name string
	// CPUs is the number of vCPUs (default 1).
	CPUs int
	// MemoryMiB is the guest RAM in MiB (default 512). A guest out of
	// memory kills a guest process, never a host one.
	MemoryMiB int
	// DiskSizeMiB bounds the writable layer (default 4096): filling it
	// gives ENOSPC inside the box.
	DiskSizeMiB int
	// Env is added to the image's environment ("KEY=value"); later entries
	// win.
	Env []string
	// WorkingDir overrides the image's working directory for every exec.
	WorkingDir string
	// User overrides the image's user: "name", "uid", "name:group" or
	// "uid:gid".
	User string
	// AutoRemove removes the box (VM, writable layer, record) when it is
	// stopped or closed.
	AutoRemove bool
	// Network is NetworkPublic (the default; NetworkEnabled is its old
	// name), NetworkAllowlist (the default when AllowNet is set) or
	// NetworkNone (no network device; NetworkDisabled is its old name).
	Network string
	// AllowNet lists what a NetworkAllowlist box may reach (see
	// NetworkPolicy.AllowNet).
	AllowNet []string `json:",omitempty"`
	// AllowHostPorts are ports of the host's 127.0.0.1 the box may reach
	// as host.airlock.internal:PORT; nothing else of the host is reachable.
	AllowHostPorts []int `json:",omitempty"`
	// Ports are published: the host listens on them at each start and
	// forwards connections into the box. A host port in use fails Start.
	Ports []PortMapping `json:",omitempty"`
}

// ExecOptions tune one Exec. Env, User and WorkingDir override the box's
// values for this exec only.
type ExecOptions struct {
	Env        []string
	User       string
	WorkingDir string
	// Timeout kills the exec's whole process tree (SIGTERM, then SIGKILL
	// after KillGrace) and sets ExecResult.TimedOut. A context deadline
	// does the same. 0 means no timeout.
	Timeout time.Duration
	// KillGrace is the delay between SIGTERM and SIGKILL (default 2 s).
	KillGrace time.Duration
	// Stdin, when non-nil, is copied to the process's standard input,
	// which is then closed. When nil the process reads /dev/null (Exec) or
	// gets a pipe written through Process.Stdin (ExecStream).
	Stdin io.Reader
}

// ExecResult is the outcome of an exec. A non-zero ExitCode is a result,
// not an error.
type ExecResult struct {
	// ExitCode is the exit status; 128+N when killed by signal N; 127 when
	// the command was not found; 126 when it could not be run.
	ExitCode int
	// Signal is the signal number that killed the process, 0 otherwise.
	Signal int
	// Stdout and Stderr hold the output, byte for byte (Exec only; empty
	// for ExecStream, whose output went to the caller's readers).
	Stdout, Stderr []byte
	// TimedOut is true when the timeout or context deadline killed it.
	TimedOut bool
	// ErrorMessage is set when the process could not run or died for a
	// reason not visible in its output.
	ErrorMessage string
	// Duration is the host-side time from request to result.
	Duration time.Duration
	// GuestDuration is the agent-side time from request receipt to the
	// process being reaped and its output drained.
	GuestDuration time.Duration
}
