package cli

import (
	"fmt"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock/internal/defaults"
	"github.com/airlock-run/airlock/internal/tenant"
)

func init() { extraCommands = append(extraCommands, newTenantCmd) }

// TenantsFileName is the tenants file's default name in the airlock home.
const TenantsFileName = "tenants.json"

func defaultTenantsFile() string { return filepath.Join(defaults.Home(), TenantsFileName) }

func newTenantCmd() *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "tenant",
		Short: "Manage the tenants of airlock serve --tenants (API tokens with their own boxes and quotas)",
		Long: `tenant manages the tenants file that airlock serve --tenants FILE reads
(default ` + TenantsFileName + ` in the airlock home). Each tenant has its own token,
sees and touches only its own boxes, snapshots and named volumes, and gets
quotas and grants of its own (docs/server.md, Tenants). The file keeps only
the SHA-256 of each token; a running server takes changes within a second
(or at once on SIGHUP), without a restart.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.PersistentFlags().StringVar(&file, "file", "", "tenants file (default "+TenantsFileName+" in the airlock home)")
	path := func() string {
		if file != "" {
			return file
		}
		return defaultTenantsFile()
	}

	var q tenant.Quota
	var g tenant.Grants
	add := &cobra.Command{
		Use:   "add NAME",
		Short: "Add a tenant and print its token (once: only its hash is kept)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := tenant.CheckName(name); err != nil {
				return usagef(cmd, "tenant add: %v", err)
			}
			if q.Boxes < 0 || q.CPUs < 0 || q.MemoryMiB < 0 || q.DiskMiB < 0 || q.Snapshots < 0 || q.Execs < 0 {
				return usagef(cmd, "tenant add: quotas are 0 (no limit) or more")
			}
			tok := tenant.NewToken()
			if err := tenant.Add(path(), tenant.Tenant{Name: name, Quota: q, Grants: g}, tok); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), tok)
			fmt.Fprintf(cmd.ErrOrStderr(), "tenant %s added to %s: its token is above, shown this once (AIRLOCK_TOKEN for its clients)\n", name, path())
			return nil
		},
	}
	f := add.Flags()
	f.IntVar(&q.Boxes, "max-boxes", 0, "most of its boxes not stopped at once (0: no limit beyond the server's)")
	f.IntVar(&q.CPUs, "max-cpus", 0, "most vCPUs of its boxes not stopped, summed (0: no limit)")
	f.IntVar(&q.MemoryMiB, "max-memory", 0, "most MiB of RAM of its boxes not stopped, summed (0: no limit)")
	f.IntVar(&q.DiskMiB, "max-disk", 0, "most MiB of disk (disk_size_mib) of all its boxes, summed (0: no limit)")
	f.IntVar(&q.Snapshots, "max-snapshots", 0, "most memory snapshots it keeps (0: no limit beyond the server's)")
	f.IntVar(&q.Execs, "max-execs", 0, "most execs it runs at once (0: the server's --max-execs)")
	f.BoolVar(&g.HostVolumes, "allow-volume", false, "let it attach host directories under the server's --allow-volume directories")
	f.BoolVar(&g.NoNamedVolumes, "deny-named-volumes", false, "refuse it named volumes (its own, by default)")
	f.BoolVar(&g.HostPorts, "allow-host-port", false, "let its boxes reach the server's --allow-host-port ports")
	f.BoolVar(&g.PrivateNet, "allow-private-net", false, "let it use the server's --allow-private-net")
	f.BoolVar(&g.Publish, "allow-publish", false, "let it publish ports under the server's --allow-publish")

	rm := &cobra.Command{
		Use:   "rm NAME",
		Short: "Remove a tenant: its token stops working (its boxes stay, for the operator to remove)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return tenant.Remove(path(), args[0])
		},
	}
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the tenants with their quotas and grants",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			tf, err := tenant.Load(path())
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tBOXES\tCPUS\tMEMORY MiB\tDISK MiB\tSNAPSHOTS\tEXECS\tGRANTS")
			lim := func(n int) string {
				if n == 0 {
					return "-"
				}
				return fmt.Sprint(n)
			}
			for _, t := range tf.Tenants {
				var gs []string
				for _, x := range []struct {
					on   bool
					name string
				}{{t.Grants.HostVolumes, "volume"}, {!t.Grants.NoNamedVolumes, "named-volumes"}, {t.Grants.HostPorts, "host-port"},
					{t.Grants.PrivateNet, "private-net"}, {t.Grants.Publish, "publish"}} {
					if x.on {
						gs = append(gs, x.name)
					}
				}
				q := t.Quota
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%v\n", t.Name, lim(q.Boxes), lim(q.CPUs), lim(q.MemoryMiB), lim(q.DiskMiB), lim(q.Snapshots), lim(q.Execs), gs)
			}
			return w.Flush()
		},
	}
	cmd.AddCommand(add, rm, ls)
	return cmd
}
