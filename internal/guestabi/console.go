package guestabi

// LogPrefix starts every line the guest agent writes to the console.
const LogPrefix = "airlock-agent: "

// FatalPrefix starts the console line of an agent that could not set up
// the box and powers off; the host reports such a death as a setup failure.
const FatalPrefix = LogPrefix + "fatal: "

// EtcFiles are the files of the box's /etc that the agent provides at every
// boot (bind-mounted from its own tmpfs): the root filesystem builder puts
// an empty regular file at each in every base to mount over.
var EtcFiles = []string{"hosts", "hostname", "resolv.conf"}

// The boot benchmark's bare init: BareParam on the kernel command line (the
// kernel hands it to /init as the environment variable AIRLOCK_BARE=1) makes
// the agent mount the image, run its /bin/true and print BareMarker.
const (
	BareParam  = "AIRLOCK_BARE=1"
	BareMarker = "AIRLOCK-BARE-MARKER"
)

// HostListenEnv, set to unix:PATH in the agent's environment, starts it in
// host mode on that socket (the fake VM driver), even as PID 1 of a PID
// namespace. The kernel never sets it.
const HostListenEnv = "AIRLOCK_AGENT_LISTEN"

// SecretPort is the virtio-serial port on which the host gives the guest
// agent the box's per-boot secret (one line, then EOF); the agent then
// serves only hosts that prove they know it (transport handshake). A guest
// without the port serves hosts without proof.
const SecretPort = "airlock.secret"
