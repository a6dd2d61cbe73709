package cli

import (
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/mcpserver"
	"github.com/airlock-run/airlock/internal/server"
)

func init() { extraCommands = append(extraCommands, newMCPCmd) }

func newMCPCmd() *cobra.Command {
	var opts airlock.BoxOptions
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve the Model Context Protocol over stdio (tools that run code in a box)",
		Long: `mcp speaks the Model Context Protocol on stdin/stdout, for agent frameworks and
desktop assistants. Tools: execute_python (a stateful Python context; matplotlib
figures come back as images), execute_command, write_file, read_file and
install_packages. One box per session, created on the first tool call and
removed when the session ends.

Example client configuration:
  {"mcpServers": {"airlock": {"command": "airlock", "args": ["mcp"]}}}`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			// stdout is the protocol: warnings and pull progress go to stderr.
			rt, err := openRuntime(cmd)
			if err != nil {
				return err
			}
			defer rt.Close()
			return mcpserver.Serve(cmd.Context(), rt, &mcp.StdioTransport{}, mcpserver.Options{Box: opts, Version: server.Version()})
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Image, "image", airlock.DefaultImage, "image of the session's box (needs Python)")
	f.IntVar(&opts.CPUs, "cpus", 0, "vCPUs of the box (default 1)")
	f.IntVar(&opts.MemoryMiB, "memory", 0, "RAM of the box in MiB (default 512)")
	f.StringVar(&opts.Network, "network", "", "enabled (default) or disabled")
	return cmd
}
