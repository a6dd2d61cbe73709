package airlock

import "fmt"

// restoredHostSide gives o, the options of a box restored from snapshot
// name, what is the new box's own and lives on the host: its hostname,
// its published ports (never the snapshot's box's: they are its host
// ports) and, when the caller names one, its network policy (the network
// helper is the new box's; the guest's device is the same for public and
// allowlist). They used to be dropped without a word: `run --from S
// --allow-net pypi.org` ran with the snapshot's public network.
// Volumes cannot be attached to a restored machine: refused.
func restoredHostSide(o *BoxOptions, opts BoxOptions, name string) error {
	if len(opts.Volumes) > 0 {
		return fmt.Errorf("%w: snapshot %s: a restored box cannot take volumes (-v): its machine is the snapshot's, which had none; copy files in with 'airlock cp' instead", ErrInvalidArgument, name)
	}
	o.Hostname, o.Ports = opts.Hostname, opts.Ports
	if o.Network == NetworkNone {
		if len(opts.AllowNet) > 0 || len(opts.AllowHostPorts) > 0 || len(opts.Ports) > 0 {
			return fmt.Errorf("%w: snapshot %s has no network (none): --allow-net, --allow-host-port and -p need one", ErrInvalidArgument, name)
		}
		return nil
	}
	if opts.Network != "" {
		o.Network = opts.Network // public or allowlist (none is refused before)
	}
	if len(opts.AllowNet) > 0 {
		o.Network, o.AllowNet = NetworkAllowlist, opts.AllowNet
	}
	if len(opts.AllowHostPorts) > 0 {
		o.AllowHostPorts = opts.AllowHostPorts
	}
	if o.Hostname != "" && !validHostname(o.Hostname) {
		return fmt.Errorf("%w: hostname %q: want letters, digits and '-', at most 63", ErrInvalidArgument, o.Hostname)
	}
	if err := checkNetwork(o); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	return nil
}
