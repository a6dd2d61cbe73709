package cli

import (
	"fmt"
	"os"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/mcpserver"
	"github.com/airlock-run/airlock/internal/server"
)

func init() { extraCommands = append(extraCommands, newMCPCmd) }

func newMCPCmd() *cobra.Command {
	var opts airlock.BoxOptions
	var nf netFlags
	var memory string
	var secretsIn []string
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve the Model Context Protocol over stdio (tools that run code in a box)",
		Long: `mcp speaks the Model Context Protocol on stdin/stdout, for agent frameworks and
desktop assistants. Tools: execute_python (a stateful Python context; matplotlib
figures come back as images), execute_command, write_file, read_file and
install_packages. One box per session, created on the first tool call and
removed when the session ends. --secret gives the session's boxes an API key
the model's code uses but never sees (as run --secret).

Example client configuration:
  {"mcpServers": {"airlock": {"command": "airlock", "args": ["mcp"]}}}`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			// stdout is the protocol: warnings and pull progress go to stderr.
			mem, err := sizeFlag("memory", memory)
			if err != nil {
				return usagef(cmd, "%v", err)
			}
			opts.MemoryMiB = mem
			if err := nf.apply(&opts); err != nil {
				return err
			}
			if opts.Secrets, err = secretFlags(secretsIn, os.LookupEnv); err != nil {
				return usagef(cmd, "%v", err)
			}
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
	f.StringVarP(&memory, "memory", "m", "", fmt.Sprintf("guest memory: 512m, 2g; a bare number is MiB (default %d MiB)", airlock.DefaultMemoryMiB))
	f.StringArrayVar(&secretsIn, "secret", nil, "pass a secret the session's box uses but never sees: NAME=HOST[,HOST...]; the box's $NAME is a placeholder that the host replaces by this process's $NAME in the headers of HTTPS requests to those hosts; repeatable")
	nf.add(cmd, false)
	return cmd
}
