package airlock

import (
	"errors"
	"fmt"

	"github.com/airlock-run/airlock/internal/boxopts"
	"github.com/airlock-run/airlock/internal/vmm"
)

// Sentinel errors. They are wrapped with the box id and more detail; test
// them with errors.Is.
var (
	// ErrBoxNotFound: no box has that id, id prefix or name.
	ErrBoxNotFound = errors.New("box not found")
	// ErrBoxNotRunning: the call needs a running box (Start it first).
	ErrBoxNotRunning = errors.New("box is not running")
	// ErrBoxRunning: the call needs a stopped box (Stop it, or force).
	ErrBoxRunning = errors.New("box is running")
	// ErrBoxPaused: the call goes into a box paused in memory (Pause):
	// its vCPUs are stopped, so its agent answers nothing until Resume
	// (airlock unpause). Exec and the file calls refuse it at once rather
	// than wait, as docker refuses an exec into a paused container. A box
	// paused to disk (Suspend) is ErrBoxNotRunning instead.
	ErrBoxPaused = errors.New("box is paused")
	// ErrBoxDied: the box's VM ended while the call was pending (QEMU
	// killed, guest kernel panic, out of memory on the host). The error
	// text names the cause and ends with the tail of the console log.
	ErrBoxDied = errors.New("box VM died")
	// ErrNameInUse: another box already has that name.
	ErrNameInUse = errors.New("box name already in use")
	// ErrImageNotFound: the image is not in the local store and could not
	// be pulled.
	ErrImageNotFound = errors.New("image not found")
	// ErrInvalidArgument: a call was given an argument it cannot use (an
	// empty command, a bad hostname). Nothing was sent to the box.
	ErrInvalidArgument = boxopts.ErrInvalid
	// ErrNotSupported: the VM driver lacks the ability the call needs
	// (snapshots, pause, reading a running box's disk).
	ErrNotSupported = vmm.ErrNotSupported
)

// DiedError describes a VM that ended unexpectedly. It matches ErrBoxDied.
type DiedError struct {
	BoxID string
	// Cause in words: "guest kernel panic", "QEMU process exited", ...
	Cause string
	// ConsoleTail is the end of the box's serial console log.
	ConsoleTail string
}

func (e *DiedError) Error() string {
	msg := fmt.Sprintf("box %s: VM died: %s", e.BoxID, e.Cause)
	if e.ConsoleTail != "" {
		msg += "\n--- console (last lines) ---\n" + e.ConsoleTail
	}
	return msg
}

// Is makes errors.Is(err, ErrBoxDied) true.
func (e *DiedError) Is(target error) bool { return target == ErrBoxDied }
