package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/server"
)

func init() { extraCommands = append(extraCommands, newEventsCmd) }

// serverClient returns an HTTP client and base URL for the running airlock
// serve: $AIRLOCK_URL (with $AIRLOCK_TOKEN) or the unix socket.
func serverClient(socket string) (c *http.Client, base string, auth func(*http.Request), where string) {
	if u := os.Getenv("AIRLOCK_URL"); u != "" {
		tok := os.Getenv("AIRLOCK_TOKEN")
		return &http.Client{}, strings.TrimRight(u, "/"), func(r *http.Request) {
			if tok != "" {
				r.Header.Set("Authorization", "Bearer "+tok)
			}
		}, u
	}
	if socket == "" {
		socket = server.DefaultSocket(airlock.DefaultHome())
	}
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}
	return &http.Client{Transport: tr}, "http://airlock", func(*http.Request) {}, socket
}

func newEventsCmd() *cobra.Command {
	var socket string
	var asJSON bool
	var since int64
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Print the events of a running airlock serve (boxes created, started, died; execs)",
		Long: `events follows /v1/events of the airlock serve on the socket (--socket, else
$AIRLOCK_SOCKET, else the home's), or of $AIRLOCK_URL with $AIRLOCK_TOKEN, and
prints one line per event until interrupted. With --since SEQ it starts after
that event (those the server still holds; an events.dropped line stands for
older ones).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, base, auth, where := serverClient(socket)
			url := base + "/v1/events"
			if since >= 0 {
				url += fmt.Sprintf("?since=%d", since)
			}
			req, err := http.NewRequestWithContext(cmd.Context(), "GET", url, nil)
			if err != nil {
				return err
			}
			auth(req)
			resp, err := c.Do(req)
			if err != nil {
				return fmt.Errorf("no airlock server answering (start one with airlock serve): %w", err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				return fmt.Errorf("GET /v1/events: %s", resp.Status)
			}
			out := cmd.OutOrStdout()
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				data, ok := strings.CutPrefix(sc.Text(), "data: ")
				if !ok {
					continue
				}
				var ev server.Event
				if json.Unmarshal([]byte(data), &ev) != nil {
					continue
				}
				if ev.Type == server.EventStreamOpen {
					fmt.Fprintf(cmd.ErrOrStderr(), "following the events of %s (interrupt to stop)\n", where)
					continue
				}
				if asJSON {
					fmt.Fprintln(out, data)
					continue
				}
				line := fmt.Sprintf("%s %6d %-16s %s", ev.Time.Local().Format(time.TimeOnly), ev.Seq, ev.Type, ev.BoxID)
				if ev.Snapshot != "" {
					line += " snapshot=" + ev.Snapshot
				}
				if len(ev.Children) > 0 {
					line += " children=" + strings.Join(ev.Children, ",")
				}
				if ev.Dropped > 0 {
					line += fmt.Sprintf(" dropped=%d", ev.Dropped)
				}
				if len(ev.Cmd) > 0 {
					line += " " + strings.Join(ev.Cmd, " ")
				}
				if ev.ExitCode != nil {
					line += fmt.Sprintf(" exit=%d", *ev.ExitCode)
				}
				if ev.TimedOut {
					line += " timed-out"
				}
				if ev.DurationMS > 0 {
					line += fmt.Sprintf(" %.1fms", ev.DurationMS)
				}
				if ev.Reason != "" {
					line += " (" + ev.Reason + ")"
				}
				if ev.Error != "" {
					line += " error: " + ev.Error
				}
				fmt.Fprintln(out, line)
			}
			if cmd.Context().Err() != nil {
				return nil
			}
			return sc.Err()
		},
	}
	cmd.Flags().StringVar(&socket, "socket", "", "the server's unix socket (default $AIRLOCK_SOCKET, else the home's)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print each event as JSON")
	cmd.Flags().Int64Var(&since, "since", -1, "start after the event of this seq (0: all the server holds)")
	return cmd
}
