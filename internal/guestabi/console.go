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
