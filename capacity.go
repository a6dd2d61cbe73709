package airlock

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Host-wide capacity: caps on the boxes running on this host (of every
// airlock home and user: QEMU processes named airlock-*) and on their total
// guest memory, checked when a box starts.
const (
	// DefaultMaxBoxes is the default cap on running boxes
	// (AIRLOCK_MAX_BOXES).
	DefaultMaxBoxes = 128
	// memoryReserveMiB is host RAM kept out of the default memory cap:
	// the larger of this and a tenth of RAM.
	memoryReserveMiB = 2048
)

// CapacityError is returned when starting a box would exceed a host-wide
// cap; it names the cap and how to change it.
type CapacityError struct {
	Cap    string // "AIRLOCK_MAX_BOXES" or "AIRLOCK_MAX_MEMORY"
	Limit  int    // boxes, or MiB
	InUse  int    // boxes, or MiB of guest memory of running boxes
	Wanted int    // MiB this box wants (memory cap), 1 for boxes
}

func (e *CapacityError) Error() string {
	if e.Cap == "AIRLOCK_MAX_BOXES" {
		return fmt.Sprintf("host capacity: %d boxes already run on this host, the cap is %d: stop a box, or raise the cap (AIRLOCK_MAX_BOXES=N)", e.InUse, e.Limit)
	}
	if e.InUse == 0 {
		return fmt.Sprintf("host capacity: the box wants %d MiB of memory, more than the host cap of %d MiB (host RAM minus a reserve): ask for less (--memory), or raise the cap (AIRLOCK_MAX_MEMORY=MiB)", e.Wanted, e.Limit)
	}
	return fmt.Sprintf("host capacity: running boxes use %d MiB of guest memory, %d MiB more would pass the cap of %d MiB: stop a box, ask for less (--memory), or raise the cap (AIRLOCK_MAX_MEMORY=MiB)", e.InUse, e.Wanted, e.Limit)
}

// capacityLimits returns the caps: AIRLOCK_MAX_BOXES (default
// DefaultMaxBoxes) and AIRLOCK_MAX_MEMORY in MiB (default host RAM minus
// the larger of 2 GiB and 10%).
func capacityLimits() (boxes, memMiB int, err error) {
	boxes = DefaultMaxBoxes
	if v := os.Getenv("AIRLOCK_MAX_BOXES"); v != "" {
		if boxes, err = strconv.Atoi(v); err != nil || boxes < 1 {
			return 0, 0, fmt.Errorf("AIRLOCK_MAX_BOXES=%q: want a number of boxes, 1 or more", v)
		}
	}
	if v := os.Getenv("AIRLOCK_MAX_MEMORY"); v != "" {
		if memMiB, err = strconv.Atoi(v); err != nil || memMiB < 64 {
			return 0, 0, fmt.Errorf("AIRLOCK_MAX_MEMORY=%q: want MiB, 64 or more", v)
		}
		return boxes, memMiB, nil
	}
	total := hostMemMiB()
	if total == 0 {
		return boxes, 1 << 30, nil
	}
	return boxes, total - max(memoryReserveMiB, total/10), nil
}

// hostMemMiB returns MemTotal from /proc/meminfo in MiB (0 if unknown).
func hostMemMiB() int {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return kb / 1024
		}
	}
	return 0
}

// runningBoxes scans /proc for QEMU processes of boxes (-name airlock-*)
// other than except's and returns how many run and their guest memory
// (-m, MiB).
func runningBoxes(except string) (n, memMiB int) {
	ents, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range ents {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte("\x00-name\x00airlock-")) {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) == 0 || !strings.Contains(filepath.Base(args[0]), "qemu") {
			continue
		}
		name, mem := "", 0
		for i := 0; i+1 < len(args); i++ {
			switch args[i] {
			case "-name":
				name = args[i+1]
			case "-m":
				mem, _ = strconv.Atoi(args[i+1])
			}
		}
		if name == except {
			continue
		}
		n++
		memMiB += mem
	}
	return n, memMiB
}

// checkCapacity returns a CapacityError if starting box id with memMiB of
// guest memory would pass a host-wide cap.
func checkCapacity(id string, memMiB int) error {
	maxBoxes, maxMem, err := capacityLimits()
	if err != nil {
		return err
	}
	if memMiB > maxMem {
		return &CapacityError{Cap: "AIRLOCK_MAX_MEMORY", Limit: maxMem, Wanted: memMiB}
	}
	n, used := runningBoxes("airlock-" + id)
	if n+1 > maxBoxes {
		return &CapacityError{Cap: "AIRLOCK_MAX_BOXES", Limit: maxBoxes, InUse: n, Wanted: 1}
	}
	if used+memMiB > maxMem {
		return &CapacityError{Cap: "AIRLOCK_MAX_MEMORY", Limit: maxMem, InUse: used, Wanted: memMiB}
	}
	return nil
}

// checkMemoryCap refuses, at creation, a box whose memory alone passes the
// host memory cap.
func checkMemoryCap(memMiB int) error {
	_, maxMem, err := capacityLimits()
	if err != nil {
		return err
	}
	if memMiB > maxMem {
		return &CapacityError{Cap: "AIRLOCK_MAX_MEMORY", Limit: maxMem, Wanted: memMiB}
	}
	return nil
}
