package cli

import (
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
)

func init() {
	extraCommands = append(extraCommands, newPortCmd, newNetworkCmd)
}

// netFlags are the network flags of run and create (and, without -p, of
// the network verb).
type netFlags struct {
	mode      string
	allow     []string
	hostPorts []int
	publish   []string
}

func (f *netFlags) add(cmd *cobra.Command, withPublish bool) {
	fl := cmd.Flags()
	fl.StringVar(&f.mode, "network", "", `network mode: "public" (default: the internet, but not the host, private networks or link-local addresses), "allowlist" (only --allow-net destinations) or "none" (no network device)`)
	fl.StringArrayVar(&f.allow, "allow-net", nil, "allow a destination: a name (api.example.com, *.example.com), an IP or CIDR, each with an optional :PORT; repeatable; implies --network allowlist")
	fl.IntSliceVar(&f.hostPorts, "allow-host-port", nil, "let the box reach the host's 127.0.0.1:PORT as host.airlock.internal:PORT; repeatable")
	if withPublish {
		fl.StringArrayVarP(&f.publish, "publish", "p", nil, "publish a box port on the host: [HOSTIP:]HOSTPORT:GUESTPORT[/tcp|udp] (HOSTIP default 127.0.0.1, HOSTPORT 0 picks one); repeatable")
	}
}

// apply puts the flags into o.
func (f *netFlags) apply(o *airlock.BoxOptions) error {
	o.Network, o.AllowNet, o.AllowHostPorts = airlock.NetworkMode(f.mode), f.allow, f.hostPorts
	for _, p := range f.publish {
		pm, err := airlock.ParsePortMapping(p)
		if err != nil {
			return fmt.Errorf("-p %s", err)
		}
		o.Ports = append(o.Ports, pm)
	}
	return nil
}

// formatPorts renders published ports as Docker does (127.0.0.1:8080->80/tcp).
func formatPorts(ps []airlock.PortMapping) string {
	var out []string
	for _, p := range ps {
		out = append(out, net.JoinHostPort(p.HostIP, strconv.Itoa(p.HostPort))+"->"+strconv.Itoa(p.GuestPort)+"/"+p.Protocol)
	}
	return strings.Join(out, ", ")
}

func newPortCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "port BOX",
		Short: "List a running box's published ports",
		Long: `List the ports BOX publishes (-p), as bound by its current start:
GUESTPORT/PROTO -> HOSTIP:HOSTPORT, one a line.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, b, err := openBox(cmd, args[0])
			if err != nil {
				return err
			}
			defer r.Close()
			ports, err := b.Ports(cmd.Context())
			if err != nil {
				return err
			}
			for _, p := range ports {
				fmt.Fprintf(cmd.OutOrStdout(), "%d/%s -> %s\n", p.GuestPort, p.Protocol, net.JoinHostPort(p.HostIP, strconv.Itoa(p.HostPort)))
			}
			return nil
		},
	}
}

func newNetworkCmd() *cobra.Command {
	var f netFlags
	cmd := &cobra.Command{
		Use:   "network BOX [--network MODE] [--allow-net DEST...] [--allow-host-port PORT...]",
		Short: "Show or change a box's network policy",
		Long: `Without flags, print BOX's network policy and, when it runs, its counters.
With flags, change it: each flag given replaces that part of the policy and
the others are kept (--allow-net lists every destination, not only new ones;
--allow-net alone switches a public box to allowlist). A running box
switches at once: its open connections to destinations the new policy
denies are closed. Published ports (-p) are fixed at creation.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, b, err := openBox(cmd, args[0])
			if err != nil {
				return err
			}
			defer r.Close()
			info, err := b.Info(cmd.Context())
			if err != nil {
				return err
			}
			o := info.Options
			fl := cmd.Flags()
			if fl.Changed("network") || fl.Changed("allow-net") || fl.Changed("allow-host-port") {
				p := airlock.NetworkPolicy{Mode: o.Network, AllowNet: o.AllowNet, AllowHostPorts: o.AllowHostPorts}
				if fl.Changed("allow-net") {
					p.Mode, p.AllowNet = airlock.NetworkAllowlist, f.allow
				}
				if fl.Changed("network") {
					p.Mode = airlock.NetworkMode(f.mode)
					if p.Mode != airlock.NetworkAllowlist && !fl.Changed("allow-net") {
						p.AllowNet = nil
					}
				}
				if fl.Changed("allow-host-port") {
					p.AllowHostPorts = f.hostPorts
				}
				return b.SetNetwork(cmd.Context(), p)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "mode:\t%s\n", o.Network)
			if len(o.AllowNet) > 0 {
				fmt.Fprintf(w, "allow-net:\t%s\n", strings.Join(o.AllowNet, ", "))
			}
			if len(o.AllowHostPorts) > 0 {
				var ps []string
				for _, p := range o.AllowHostPorts {
					ps = append(ps, strconv.Itoa(p))
				}
				fmt.Fprintf(w, "allow-host-port:\t%s\n", strings.Join(ps, ", "))
			}
			if len(o.Ports) > 0 {
				var ps []string
				for _, p := range o.Ports {
					ps = append(ps, p.String())
				}
				fmt.Fprintf(w, "publish:\t%s\n", strings.Join(ps, ", "))
			}
			if st, err := b.NetworkStats(cmd.Context()); err == nil {
				fmt.Fprintf(w, "bytes out/in:\t%d / %d\n", st.BytesOut, st.BytesIn)
				fmt.Fprintf(w, "connections:\t%d\n", st.Connections)
				fmt.Fprintf(w, "dns queries:\t%d\n", st.DNSQueries)
				fmt.Fprintf(w, "denied:\t%d (airlock logs --network %s)\n", st.Denied, b.ID())
			}
			return w.Flush()
		},
	}
	f.add(cmd, false)
	return cmd
}

// printNetworkLog copies the box's log of denied attempts to w.
func printNetworkLog(w io.Writer, b *airlock.Box) error {
	f, err := os.Open(b.NetworkLog())
	if os.IsNotExist(err) {
		return nil // nothing denied yet
	}
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}
