package airlock

import (
	"io"
	"time"

	"github.com/airlock-run/airlock/internal/boxrecord"
)

// Defaults for BoxOptions fields left zero.
const (
	DefaultImage       = "python:slim"
	DefaultCPUs        = 1
	DefaultMemoryMiB   = 512
	DefaultDiskSizeMiB = 4096
)

// Bounds of BoxOptions fields.
const (
	// MaxCPUs is the most vCPUs a box may have.
	MaxCPUs = 64
	// MinMemoryMiB is the least RAM a box may have, in MiB.
	MinMemoryMiB = 64
	// MinDiskSizeMiB is the smallest writable layer a box may have, in MiB.
	MinDiskSizeMiB = 16
)

// BoxOptions describe a box. The zero value is a python:slim box with
// 1 vCPU, 512 MiB of RAM, a 4 GiB writable layer and network mode
// NetworkPublic (the internet, but not the host or private ranges).
type BoxOptions struct {
	// Image is an image reference in Docker syntax ("python:slim",
	// "localhost:5000/img@sha256:..."); default DefaultImage. It is taken
	// from the local store, or pulled if absent.
	Image string
	// Name is an optional unique name, usable wherever an id is: letters,
	// digits and _ . - (not first), at most MaxNameLen bytes, as Docker's
	// container names (ErrInvalidArgument otherwise).
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
	// "uid:gid". A numeric uid the box's /etc/passwd does not list gets
	// the gid of the same number. A user other than root runs with
	// no_new_privs and an empty capability bounding set: setuid and
	// file-capability binaries in the image do not make it root again.
	User string
	// AutoRemove removes the box (VM, writable layer, record) when it is
	// stopped or closed.
	AutoRemove bool
	// Network is NetworkPublic (the default; NetworkEnabled is its old
	// name), NetworkAllowlist (the default when AllowNet is set) or
	// NetworkNone (no network device; NetworkDisabled is its old name);
	// with DenyNet set the default is NetworkPublic.
	Network NetworkMode
	// Volumes are host directories and named volumes attached to the box
	// (see Volume).
	Volumes []Volume `json:",omitempty"`
	// Hostname is the box's host name (default: Name when it is a valid
	// host name, else the id). Letters, digits and '-', at most 63.
	Hostname string `json:",omitempty"`
	// FromSnapshot, when set, makes Create restore the memory snapshot of
	// that name (Box.Snapshot) instead of booting: the box runs on from
	// where the snapshot's box was, with its processes and files. Image,
	// CPUs, MemoryMiB, DiskSizeMiB and Network come from the snapshot
	// (left zero, or equal to the snapshot's; public and allowlist are
	// one machine: AllowNet makes the restored box an allowlist one, DenyNet
	// a public one); Env, WorkingDir, User, Labels, AllowNet, DenyNet and
	// AllowHostPorts default to the
	// snapshot's box's; Hostname and Ports are the caller's (never the
	// snapshot's box's ports); Volumes are refused (ErrInvalidArgument).
	// See docs/snapshots.md.
	FromSnapshot string
	// AllowNet lists what a NetworkAllowlist box may reach (see
	// NetworkPolicy.AllowNet).
	AllowNet []string `json:",omitempty"`
	// DenyNet lists what a NetworkPublic box may not reach (see
	// NetworkPolicy.DenyNet).
	DenyNet []string `json:",omitempty"`
	// AllowHostPorts are ports of the host's 127.0.0.1 the box may reach
	// as host.airlock.internal:PORT; nothing else of the host is reachable.
	AllowHostPorts []int `json:",omitempty"`
	// Ports are published: the host listens on them at each start and
	// forwards connections into the box. A host port in use fails Start.
	Ports []PortMapping `json:",omitempty"`
	// TTL, when positive, is how long the box lives: the library removes
	// it (running or not) once TTL has passed since Create. The deadline
	// is stored with the box (BoxInfo.ExpiresAt): every Runtime open on
	// the home enforces it, at Open and while it stays open (see
	// Options.ReapInterval). 0: no limit; negative: ErrInvalidArgument.
	TTL time.Duration `json:",omitempty"`
	// IdleTimeout, when positive, acts on the box (IdleAction: by default
	// removes it) once no exec, file or snapshot call went through a Box
	// for that long (an exec in flight counts as use; so does traffic on
	// its network, for IdleSuspend and IdleStop). Use is recorded with the
	// box at most every few seconds, so other processes on the home see
	// it. 0: no limit.
	IdleTimeout time.Duration `json:",omitempty"`
	// IdleAction is what IdleTimeout does to an idle box: IdleRemove (""
	// is the same), IdleStop or IdleSuspend (scale to zero: paused to
	// disk, resumed by the next call or inbound connection; see
	// IdleSuspend). Set without IdleTimeout, or another value:
	// ErrInvalidArgument.
	IdleAction IdleAction `json:",omitempty"`
	// Secrets are values the box's code uses without seeing them (API
	// keys), by environment variable name: in the box, the variable holds
	// a placeholder of its own ("airlock-secret-" and 32 hex digits, per
	// box and secret); the box's network helper replaces it by Value in
	// the headers of the HTTPS requests to the secret's Hosts (port 443),
	// terminating those connections with a certificate of the box's own
	// CA, which the box trusts. Nowhere else: not over plain HTTP, not in
	// URLs or bodies, not to other hosts. Names are environment variable
	// names; at most MaxSecrets. Under an allowlist, the hosts' port 443
	// is allowed. Values are kept in the box directory (0600), never in
	// the box, its record, a snapshot or an archive: a box restored from a
	// snapshot or imported has only the secrets its Create names. See
	// docs/network.md#secrets.
	Secrets map[string]Secret `json:",omitempty"`
	// Lease, when positive, removes the box unless Box.RenewLease is
	// called within Lease of Create or of the last renewal: a client
	// that crashes leaves no box behind. 0: no lease.
	Lease time.Duration `json:",omitempty"`
	// Labels are the caller's key/value pairs, stored with the box and
	// shown in BoxInfo.Options (the E2B API's sandbox metadata is kept
	// here). At most MaxLabels; a key is 1..MaxLabelKeyLen bytes and a
	// value at most MaxLabelValueLen, both valid UTF-8 without control
	// characters (ErrInvalidArgument otherwise).
	Labels map[string]string `json:",omitempty"`
}

// Bounds of BoxOptions.Labels.
const (
	// MaxLabels is the most labels a box may have.
	MaxLabels = boxrecord.MaxLabels
	// MaxLabelKeyLen is the longest label key, in bytes.
	MaxLabelKeyLen = boxrecord.MaxLabelKeyLen
	// MaxLabelValueLen is the longest label value, in bytes.
	MaxLabelValueLen = boxrecord.MaxLabelValueLen
)

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
	// TTY runs the process on a new terminal (PTY) in the box, of Rows x
	// Cols cells (0: 24 x 80; change it with Process.Resize): stdin,
	// stdout and stderr are the terminal, so all output arrives on stdout,
	// with the terminal's line endings (\r\n), and a Ctrl-C byte (0x03)
	// written to stdin sends SIGINT to the process, as on a terminal.
	TTY        bool
	Rows, Cols int
	// Stdin, when non-nil, is copied to the process's standard input,
	// which is then closed. When nil the process reads /dev/null (Exec) or
	// gets a pipe written through Process.Stdin (ExecStream).
	Stdin io.Reader
	// MaxOutput bounds, in bytes, how much of each of stdout and stderr
	// Exec and ExecStart keep (default DefaultMaxOutput, 16 MiB; negative
	// keeps every byte, in host memory). Past it they keep the first and
	// the last MaxOutput/2 bytes, drop the middle inside the box (it never
	// crosses to the host) and set ExecResult.Truncated and the Dropped
	// counts.
	// ExecStream ignores it: it delivers every byte, with backpressure.
	MaxOutput int64
	// Stdout and Stderr, when set, receive ExecStream's output as it
	// arrives, instead of Process.Stdout and Process.Stderr (a slow writer
	// slows the guest process down; a nil one of the two discards that
	// stream). Exec and ExecStart ignore them.
	Stdout, Stderr io.Writer
	// Main marks the exec as the box's main command (what `airlock run`
	// runs): when it ends, that is recorded as the end of the box's
	// current boot (BoxInfo.Exit: ExitExited with its status, or
	// ExitOOMKilled when the guest's OOM killer took it), unless an end of
	// that boot is recorded already. Wait returns once it is recorded.
	Main bool
	// Background makes the exec, while it runs, not keep the box in use
	// for BoxOptions.IdleTimeout (its start counts as a use; any other
	// exec keeps the box in use until it ends): for a relay to a daemon
	// of the box, as CodeBox contexts use, whose work is marked with
	// Box.Use instead.
	Background bool
}

// DefaultMaxOutput is ExecOptions.MaxOutput's default: 16 MiB per stream.
const DefaultMaxOutput = 16 << 20

// ExecResult is the outcome of an exec. A non-zero ExitCode is a result,
// not an error.
type ExecResult struct {
	// ExitCode is the exit status; 128+N when killed by signal N; 127 when
	// the command was not found; 126 when it could not be run; -1 when the
	// host stopped waiting for a timed-out exec whose end the box did not
	// report (TimedOut, ErrorMessage says so, Box.Unhealthy is set).
	ExitCode int
	// Signal is the signal number that killed the process, 0 otherwise.
	Signal int
	// Stdout and Stderr hold the output, byte for byte up to
	// ExecOptions.MaxOutput each; past it, its head and tail (Exec only;
	// empty for ExecStream, whose output went to the caller's readers).
	Stdout, Stderr []byte
	// Truncated is true when bytes were dropped from Stdout or Stderr
	// (ExecOptions.MaxOutput); StdoutDropped and StderrDropped say how
	// many, taken out between the kept head and tail.
	Truncated                    bool
	StdoutDropped, StderrDropped int64
	// OOMKilled is true when the guest's OOM killer killed a process of
	// the exec (as Docker's OOMKilled): the exec's memory limit or the
	// box's RAM ran out. The exit status is then usually 137.
	OOMKilled bool
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
