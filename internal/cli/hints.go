package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/image"
)

// report prints err, then what the user can do about it, as airlock
// commands: the library's errors say what happened, not which verb to run.
// box names the box the error is about ("" when unknown).
func report(w io.Writer, err error, box string) {
	fmt.Fprintln(w, "airlock:", err)
	if h := hint(err, box); h != "" {
		fmt.Fprintln(w, "airlock: hint:", h)
	}
}

func hint(err error, box string) string {
	if box == "" {
		box = "BOX"
	}
	var iu *airlock.ImageInUseError
	var ce *airlock.CapacityError
	var pe *image.PullError
	var md *missingDirError
	switch {
	case errors.As(err, &md):
		if md.box != "" {
			box = md.box
		}
		return fmt.Sprintf("make the directory first: airlock exec %s mkdir -p %s (airlock cp, as docker cp, does not make it)", box, md.dir)
	case errors.As(err, &ce) && ce.Cap == "AIRLOCK_MAX_BOXES":
		return "stop a box ('airlock ls' lists them), or raise the cap: AIRLOCK_MAX_BOXES=N"
	case errors.As(err, &ce):
		return "ask for less memory (--memory), stop a box, or raise the cap: AIRLOCK_MAX_MEMORY=MiB"
	case errors.As(err, &iu) && len(iu.Boxes) == 0:
		return fmt.Sprintf("remove them first ('airlock snapshot rm %s'), or use 'airlock rmi -f'", strings.Join(iu.Snapshots, " "))
	case errors.As(err, &iu):
		return fmt.Sprintf("remove them first ('airlock rm -f %s'), or use 'airlock rmi -f'", strings.Join(iu.Boxes, " "))
	case errors.Is(err, airlock.ErrBoxRunning):
		return fmt.Sprintf("stop it first (airlock stop %s), or force removal (airlock rm -f %s)", box, box)
	case errors.Is(err, airlock.ErrBoxPaused):
		return "" // paused in memory: the error names airlock unpause, one hint is enough
	case errors.Is(err, airlock.ErrBoxNotRunning) && strings.Contains(err.Error(), "unpause it first"):
		return "" // paused to disk: the error says to unpause it, one hint is enough
	case errors.Is(err, airlock.ErrBoxNotRunning):
		return fmt.Sprintf("start it first: airlock start %s", box)
	case errors.Is(err, airlock.ErrBoxNotFound):
		return "see 'airlock ls -a' for the boxes of " + airlock.DefaultHome()
	case errors.As(err, &pe) && pe.Suggestion == "":
		return "" // the error names 'airlock images' already
	case errors.Is(err, airlock.ErrImageNotFound):
		return "see 'airlock images' for the local images"
	case errors.Is(err, airlock.ErrSnapshotNotFound):
		return "see 'airlock snapshot ls' for the snapshots of " + airlock.DefaultHome()
	case errors.Is(err, airlock.ErrSnapshotExists):
		return "" // each producer's error says what to do (snapshot create's names the command): one hint is enough
	case errors.Is(err, airlock.ErrBoxDied):
		return fmt.Sprintf("start it again with airlock start %s; airlock logs --console %s shows its console", box, box)
	}
	return ""
}
