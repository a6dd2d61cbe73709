package cli

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
	"github.com/airlock-run/airlock/internal/assets"
)

func init() { extraCommands = append(extraCommands, newVersionCmd) }

// clientVersion is this binary's version: the module version when built
// from a tagged module, else "devel", with the VCS revision when known.
func clientVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	v := bi.Main.Version
	if v == "" || v == "(devel)" {
		v = "devel"
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if rev != "" {
		v += " (" + rev[:min(12, len(rev))] + dirty + ")"
	}
	return v
}

// versionInfo is what airlock version reports.
type versionInfo struct {
	Client    string // this binary
	GoVersion string
	Protocol  string // the host-agent protocol version
	Agent     string // the guest agent binary boxes boot with
	Kernel    string // the guest kernel: kind, version, path
	QEMU      string
	Problems  []string `json:",omitempty"` // parts that could not be found
}

func collectVersion() versionInfo {
	v := versionInfo{Client: clientVersion(), GoVersion: runtime.Version(), Protocol: agentpb.Version}
	if p, err := assets.FindAgent(); err != nil {
		v.Problems = append(v.Problems, "agent: "+err.Error())
	} else {
		v.Agent = p + " (protocol " + agentpb.Version + ")"
	}
	if k, _, err := assets.FindKernel(""); err != nil {
		v.Problems = append(v.Problems, "kernel: "+err.Error())
	} else {
		v.Kernel = fmt.Sprintf("%s %s (%s)", k.Kind, k.Version, k.Path)
	}
	if out, err := exec.Command("qemu-system-x86_64", "--version").Output(); err != nil {
		v.Problems = append(v.Problems, "qemu: qemu-system-x86_64 not found or failed")
	} else {
		v.QEMU = strings.TrimPrefix(strings.SplitN(string(out), "\n", 2)[0], "QEMU emulator version ")
	}
	return v
}

func newVersionCmd() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the versions of airlock, its guest agent and kernel, and QEMU",
		Long: `Print the version of this airlock binary, the host-agent protocol, the guest
agent and kernel boxes boot with, and QEMU. Nothing is booted. --format json
prints one JSON object; a Go template picks fields: '{{.Client}}'.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			v := collectVersion()
			w := cmd.OutOrStdout()
			switch format {
			case "":
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintf(tw, "Client:\t%s\nGo:\t%s\nProtocol:\t%s\nAgent:\t%s\nKernel:\t%s\nQEMU:\t%s\n",
					v.Client, v.GoVersion, v.Protocol, v.Agent, v.Kernel, v.QEMU)
				tw.Flush()
				for _, p := range v.Problems {
					fmt.Fprintln(cmd.ErrOrStderr(), "airlock:", p, "(see airlock doctor)")
				}
			case "json":
				b, _ := json.MarshalIndent(v, "", "    ")
				fmt.Fprintf(w, "%s\n", b)
			default:
				t, err := parseTemplate(format)
				if err != nil {
					return err
				}
				return executeLine(w, t, v)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&format, "format", "f", "", "json, or a Go template such as '{{.Client}}'")
	return cmd
}
