package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/airlock-run/airlock"
)

// boxRow is one box as ls lists it; its fields are what --format
// templates and --format json see.
type boxRow struct {
	ID      string
	Name    string
	Image   string
	State   string // created, running, stopped
	Status  string // "Up 3 minutes", "Exited (5) 2 minutes ago", ...
	Reason  string `json:",omitempty"` // why it stopped: stopped, exited, oom-killed, vm-died
	Exit    int    `json:"ExitCode"`
	CPUs    int
	Memory  string // "512 MiB"
	Created time.Time
	Started time.Time         `json:",omitempty"`
	Ports   string            `json:",omitempty"` // published ports: "127.0.0.1:8080->80/tcp"
	Paused  bool              // running with its vCPUs stopped (airlock pause)
	Labels  map[string]string `json:",omitempty"`
}

func rowOf(r *airlock.Runtime, b airlock.BoxInfo) boxRow {
	row := boxRow{ID: b.ID, Name: b.Name, Image: b.Image, State: string(b.State), CPUs: b.Options.CPUs,
		Memory: fmt.Sprintf("%d MiB", b.Options.MemoryMiB), Created: b.Created, Started: b.Started,
		Ports: formatPorts(b.Ports), Labels: b.Options.Labels}
	var e airlock.ExitState
	ok := b.Exit != nil
	if ok {
		e = *b.Exit
		row.Reason, row.Exit = string(e.Reason), e.ExitCode
	}
	row.Status = statusText(b, e, ok, time.Now())
	if b.State == airlock.BoxRunning && paused(r, b.ID) {
		row.Paused = true
		row.Status += " (Paused)" // as docker ps
	}
	if b.Suspended {
		row.Status = "Paused to disk"
		if b.Options.IdleAction == airlock.IdleSuspend {
			row.Status = "Suspended (idle)"
		}
		if ok {
			row.Status += " " + humanDuration(time.Since(e.Finished)) + " ago"
		}
	}
	return row
}

// paused reports whether the running box id is paused (airlock pause);
// false when that cannot be told.
func paused(r *airlock.Runtime, id string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	b, err := r.Get(ctx, id)
	if err != nil {
		return false
	}
	p, err := b.Paused(ctx)
	return err == nil && p
}

// statusText is the STATUS column, as docker ps words it: "Up 3
// minutes", "Exited (5) 2 minutes ago", "OOM killed (137) 1 hour ago",
// "VM died 5 seconds ago: guest kernel panic", "Stopped 2 days ago",
// "Created".
func statusText(b airlock.BoxInfo, e airlock.ExitState, ok bool, now time.Time) string {
	switch b.State {
	case airlock.BoxRunning:
		return "Up " + humanDuration(now.Sub(b.Started))
	case airlock.BoxCreated:
		return "Created"
	}
	if !ok {
		return "Stopped"
	}
	ago := humanDuration(now.Sub(e.Finished)) + " ago"
	switch e.Reason {
	case airlock.ExitExited:
		return fmt.Sprintf("Exited (%d) %s", e.ExitCode, ago)
	case airlock.ExitOOMKilled:
		return fmt.Sprintf("OOM killed (%d) %s", e.ExitCode, ago)
	case airlock.ExitVMDied:
		return "VM died " + ago + ": " + e.Cause
	}
	return "Stopped " + ago
}

// humanDuration words d as docker does ("Less than a second", "About a
// minute", "3 hours").
func humanDuration(d time.Duration) string {
	s := int(d.Seconds())
	switch {
	case s < 1:
		return "Less than a second"
	case s == 1:
		return "1 second"
	case s < 60:
		return fmt.Sprintf("%d seconds", s)
	}
	m := int(d.Minutes())
	switch {
	case m == 1:
		return "About a minute"
	case m < 60:
		return fmt.Sprintf("%d minutes", m)
	}
	h := int(d.Round(time.Hour).Hours())
	switch {
	case h == 1:
		return "About an hour"
	case h < 48:
		return fmt.Sprintf("%d hours", h)
	case h < 24*7*2:
		return fmt.Sprintf("%d days", h/24)
	case h < 24*30*2:
		return fmt.Sprintf("%d weeks", h/24/7)
	case h < 24*365*2:
		return fmt.Sprintf("%d months", h/24/30)
	}
	return fmt.Sprintf("%d years", h/24/365)
}
