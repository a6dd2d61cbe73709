package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/image"
)

func init() { extraCommands = append(extraCommands, newInspectCmd) }

// boxInspect is what inspect prints for a box, in the shape of docker
// inspect (JSON keys are the field names, so templates and jq use the
// same names: .State.Status, .Config.MemoryMiB).
type boxInspect struct {
	Type            string // "box"
	ID              string
	Name            string
	Created         time.Time
	Image           string
	ImageDigest     string
	State           boxState
	Config          boxConfigView
	NetworkSettings networkView
	Mounts          []mountView
	Ports           []portView
	ConsoleLogPath  string
}

type boxState struct {
	Status  string // created, running, stopped
	Running bool
	Paused  bool // running with its vCPUs stopped (airlock pause)
	// PausedToDisk: stopped with its memory saved (pause --to-disk);
	// unpause or start continue it.
	PausedToDisk bool
	Pid          int    // QEMU's pid while running
	Reason       string // why the last boot ended: stopped, exited, oom-killed, vm-died ("" if unknown)
	ExitCode     int    // the main command's exit status (Reason exited, oom-killed)
	OOMKilled    bool
	Died         bool   // the VM ended on its own
	DiedCause    string // why, in words
	StartedAt    time.Time
	FinishedAt   time.Time
	Description  string // as ls words it: "Up 3 minutes", "Exited (5) 2 minutes ago"
	// IdleDeadline is when Config.IdleAction is taken unless the box is
	// used before (absent: no idle timeout).
	IdleDeadline time.Time `json:",omitzero"`
}

type boxConfigView struct {
	Image       string
	Cmd         []string // the main command (run -d, create IMAGE COMMAND), else the image's default command
	Env         []string // added to the image's
	WorkingDir  string
	User        string
	Hostname    string
	CPUs        int
	MemoryMiB   int
	DiskSizeMiB int
	AutoRemove  bool
	Labels      map[string]string // as docker inspect's Config.Labels
	// IdleTimeout is how long the box may go unused before IdleAction
	// (remove, stop, suspend) is taken ("" with no idle timeout);
	// State.IdleDeadline is when, unless it is used before.
	IdleTimeout string `json:",omitempty"`
	IdleAction  string `json:",omitempty"`
}

type networkView struct {
	Mode string // public, allowlist, none
	// Secrets are the box's secrets: names and hosts, never a value.
	Secrets []secretView `json:",omitempty"`
}

type secretView struct {
	Name  string
	Hosts []string
}

type mountView struct {
	Type, Source, Destination string
	ReadOnly                  bool
}

type portView struct {
	HostIP            string
	HostPort, BoxPort int
	Protocol          string
}

// imageInspect is what inspect prints for an image.
type imageInspect struct {
	Type    string // "image"
	ID      string // the manifest digest
	Ref     string
	Size    int64 // bytes, as stored
	Created time.Time
	Source  string
	Config  image.ImageConfig
	InUseBy []string // ids of boxes made from it
}

func newInspectCmd() *cobra.Command {
	var format, typ string
	cmd := &cobra.Command{
		Use:   "inspect [flags] BOX|IMAGE...",
		Short: "Print boxes and images as JSON",
		Long: `Print what airlock knows of each box or image named (a box id, id prefix or
name; else an image reference or digest), as one JSON array, in the shape of
docker inspect: .State (Status, Reason, ExitCode, OOMKilled, Died, DiedCause,
StartedAt, FinishedAt), .Config, .NetworkSettings, .Mounts, .Ports.

--format applies a Go template to each: --format '{{.State.Status}}',
'{{.Config.MemoryMiB}}', '{{json .State}}'. Exit status 1 when a name matches
nothing (the others are still printed).`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if typ != "" && typ != "box" && typ != "image" {
				return usagef(cmd, "inspect: --type %q: want box or image", typ)
			}
			r, err := openRuntime(cmd)
			if err != nil {
				return err
			}
			defer r.Close()
			var out []any
			failed := false
			for _, name := range args {
				v, err := inspectOne(cmd, r, name, typ)
				if err != nil {
					fmt.Fprintln(cmd.ErrOrStderr(), "airlock:", err)
					failed = true
					continue
				}
				out = append(out, v)
			}
			w := cmd.OutOrStdout()
			if format != "" && format != "json" {
				t, err := parseTemplate(format)
				if err != nil {
					return err
				}
				for _, v := range out {
					if err := executeLine(w, t, v); err != nil {
						return err
					}
				}
			} else {
				if out == nil {
					out = []any{}
				}
				enc := json.NewEncoder(w)
				enc.SetEscapeHTML(false)
				enc.SetIndent("", "    ")
				if err := enc.Encode(out); err != nil {
					return err
				}
			}
			if failed {
				return &ExitError{1}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&format, "format", "f", "", "a Go template applied to each object, e.g. '{{.State.Status}}' (default: JSON)")
	cmd.Flags().StringVar(&typ, "type", "", "only look for a box or an image of that name (box, image)")
	cmd.ValidArgsFunction = completeBoxesAndImages
	return cmd
}

// inspectOne describes the box or image called name.
func inspectOne(cmd *cobra.Command, r *airlock.Runtime, name, typ string) (any, error) {
	ctx := cmd.Context()
	var boxErr error
	if typ != "image" {
		b, err := r.Get(ctx, name)
		if err == nil {
			info, err := b.Info(ctx)
			if err != nil {
				return nil, err
			}
			return inspectBox(r, b, info), nil
		}
		if typ == "box" || !errors.Is(err, airlock.ErrBoxNotFound) {
			return nil, err
		}
		boxErr = err
	}
	s, err := openImages()
	if err != nil {
		return nil, err
	}
	img, err := s.Resolve(name)
	if err != nil {
		if boxErr != nil {
			return nil, fmt.Errorf("no box or image %q (see 'airlock ls -a' and 'airlock images')", name)
		}
		return nil, err
	}
	users, _ := r.ImageInUse(ctx, img.Digest)
	return imageInspect{Type: "image", ID: img.Digest, Ref: img.Ref, Size: img.Size, Created: img.Created,
		Source: img.Source, Config: img.Config, InUseBy: append([]string{}, users...)}, nil
}

func inspectBox(r *airlock.Runtime, b *airlock.Box, info airlock.BoxInfo) boxInspect {
	o := info.Options
	row := rowOf(r, info)
	st := boxState{Status: string(info.State), Running: info.State == airlock.BoxRunning, Pid: info.PID, StartedAt: info.Started,
		Description: row.Status, Paused: row.Paused, PausedToDisk: info.Suspended, IdleDeadline: info.IdleDeadline}
	if e := info.Exit; e != nil {
		st.Reason, st.ExitCode, st.FinishedAt = string(e.Reason), e.ExitCode, e.Finished
		st.OOMKilled = e.Reason == airlock.ExitOOMKilled
		st.Died = e.Reason == airlock.ExitVMDied
		st.DiedCause = e.Cause
	}
	cmdline := b.DefaultCommand()
	if m, ok := readMainSpec(b); ok {
		cmdline = m.Argv
	}
	return boxInspect{
		Type: "box", ID: info.ID, Name: info.Name, Created: info.Created, Image: info.Image, ImageDigest: info.ImageDigest,
		State: st,
		Config: boxConfigView{Image: o.Image, Cmd: cmdline, Env: append([]string{}, o.Env...), WorkingDir: o.WorkingDir, User: o.User,
			Hostname: b.Hostname(), CPUs: o.CPUs, MemoryMiB: o.MemoryMiB, DiskSizeMiB: o.DiskSizeMiB, AutoRemove: o.AutoRemove,
			Labels: o.Labels, IdleTimeout: idleTimeoutOf(o), IdleAction: idleActionOf(o)},
		NetworkSettings: networkView{Mode: string(o.Network), Secrets: secretsOf(o.Secrets)},
		Mounts:          mountsOf(o.Volumes),
		Ports:           portsOf(info.Ports, o.Ports),
		ConsoleLogPath:  b.ConsoleLog(),
	}
}

// idleTimeoutOf is .Config.IdleTimeout: o's idle timeout as a duration
// ("" without one).
func idleTimeoutOf(o airlock.BoxOptions) string {
	if o.IdleTimeout <= 0 {
		return ""
	}
	return o.IdleTimeout.String()
}

// idleActionOf is .Config.IdleAction: what o's idle timeout does (remove
// when not set; "" without an idle timeout).
func idleActionOf(o airlock.BoxOptions) string {
	switch {
	case o.IdleTimeout <= 0:
		return ""
	case o.IdleAction == "":
		return string(airlock.IdleRemove)
	}
	return string(o.IdleAction)
}

// secretsOf is .NetworkSettings.Secrets, by name.
func secretsOf(m map[string]airlock.Secret) []secretView {
	var out []secretView
	for n, s := range m {
		out = append(out, secretView{Name: n, Hosts: s.Hosts})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// mountsOf is .Mounts: "bind" for a host directory, "volume" for a named
// volume, as docker inspect says.
func mountsOf(vols []airlock.Volume) []mountView {
	out := []mountView{}
	for _, v := range vols {
		t := "volume"
		if v.IsHostDir() {
			t = "bind"
		}
		out = append(out, mountView{Type: t, Source: v.Source, Destination: v.Target, ReadOnly: v.ReadOnly})
	}
	return out
}

// portsOf is .Ports: the ports bound at this start when the box runs,
// else the ones asked for (HostPort 0: picked at start).
func portsOf(bound, asked []airlock.PortMapping) []portView {
	ps := bound
	if len(ps) == 0 {
		ps = asked
	}
	out := []portView{}
	for _, p := range ps {
		proto := p.Protocol
		if proto == "" {
			proto = "tcp"
		}
		out = append(out, portView{HostIP: p.HostIP, HostPort: p.HostPort, BoxPort: p.GuestPort, Protocol: proto})
	}
	return out
}
