package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"

	"github.com/airlock-run/airlock"
)

func TestReportAddsTheCommandToRun(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: 0123: stop it first, or remove it with force to kill its VM", airlock.ErrBoxRunning), "airlock rm -f keep"},
		{fmt.Errorf("%w: 0123", airlock.ErrBoxNotRunning), "airlock start keep"},
		{fmt.Errorf("%w: %q", airlock.ErrBoxNotFound, "keep"), "airlock ls -a"},
		{&airlock.DiedError{BoxID: "0123", Cause: "guest kernel panic"}, "airlock logs --console keep"},
		{&airlock.CapacityError{Cap: "AIRLOCK_MAX_BOXES", Limit: 1, InUse: 1, Wanted: 1}, "AIRLOCK_MAX_BOXES=N"},
		{fmt.Errorf("box x: %w", &airlock.CapacityError{Cap: "AIRLOCK_MAX_MEMORY", Limit: 64, Wanted: 128}), "--memory"},
		{&missingDirError{err: fmt.Errorf("box x: stat /root/nope: %w", fs.ErrNotExist), dir: "/root/nope"}, "airlock exec keep mkdir -p /root/nope"},
	} {
		var w bytes.Buffer
		report(&w, c.err, "keep")
		if !strings.HasPrefix(w.String(), "airlock: "+c.err.Error()+"\n") || !strings.Contains(w.String(), c.want) {
			t.Errorf("%v: printed %q, want it to mention %q", c.err, w.String(), c.want)
		}
	}
	var w bytes.Buffer
	report(&w, errors.New("disk full"), "keep")
	if w.String() != "airlock: disk full\n" {
		t.Errorf("no hint expected: %q", w.String())
	}
}

// A box paused to disk: its error says to unpause it, and no second hint
// ("start it first") follows (#39 point 5), nor for a box paused in memory; an image error without a near
// name names 'airlock images' once.
func TestReportOneHint(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("%w: keep is paused to disk: unpause it first (airlock unpause keep, or Box.Resume)", airlock.ErrBoxNotRunning),
		// paused in memory: the library's error names airlock unpause.
		fmt.Errorf("%w: keep: its processes are stopped until it is unpaused (airlock unpause keep, or Box.Resume)", airlock.ErrBoxPaused),
		// snapshot create of a name in use: the advice once, naming the command.
		snapshotExists("warm"),
	} {
		var w bytes.Buffer
		report(&w, err, "keep")
		if w.String() != "airlock: "+err.Error()+"\n" {
			t.Errorf("printed %q, want the error alone", w.String())
		}
	}
	if e := snapshotExists("warm").Error(); !strings.Contains(e, "airlock snapshot rm warm") || strings.Count(e, "another name") != 1 || !errors.Is(snapshotExists("warm"), airlock.ErrSnapshotExists) {
		t.Errorf("snapshot create of a name in use: %q", e)
	}
}
