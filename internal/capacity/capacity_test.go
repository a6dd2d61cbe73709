package capacity

import (
	"strings"
	"testing"
)

func TestCapResolve(t *testing.T) {
	if l := Resolve(0, 0, 16384); l.Boxes != DefaultMaxBoxes || l.MemoryMiB != 16384-2048 {
		t.Errorf("defaults on 16 GiB: %+v, want %d boxes and %d MiB", l, DefaultMaxBoxes, 16384-2048)
	}
	if l := Resolve(0, 0, 65536); l.MemoryMiB != 65536-6553 {
		t.Errorf("defaults on 64 GiB: %d MiB, want RAM minus a tenth", l.MemoryMiB)
	}
	if l := Resolve(3, 1000, 65536); l.Boxes != 3 || l.MemoryMiB != 1000 {
		t.Errorf("set caps: %+v, want them kept", l)
	}
	if l := Resolve(0, 0, 0); l.MemoryMiB != 1<<30 {
		t.Errorf("unknown RAM: %d MiB, want no memory cap to speak of", l.MemoryMiB)
	}
}

func TestCapStart(t *testing.T) {
	l := Limits{Boxes: 2, MemoryMiB: 1100}
	if e := l.Start(nil, 1090); e == nil || e.Cap != CapMemory || e.Wanted != 1090+OverheadMiB || e.InUse != 0 ||
		!strings.Contains(e.Error(), "more than the host cap of 1100 MiB") {
		t.Errorf("a box larger than the cap alone: %+v", e)
	}
	if e := l.Start(nil, 512); e != nil {
		t.Errorf("uncounted machines, a box that fits alone: %v", e)
	}
	if e := l.Start(&Usage{Machines: 2, MemoryMiB: 128}, 64); e == nil || e.Cap != CapBoxes || e.InUse != 2 || e.Limit != 2 ||
		e.Error() != "host capacity: 2 boxes already run on this host, the cap is 2 (Options.MaxBoxes, or AIRLOCK_MAX_BOXES=N)" {
		t.Errorf("third box at a cap of 2: %v", e)
	}
	u := &Usage{Machines: 1, MemoryMiB: 512}
	e := l.Start(u, 512)
	if e == nil || e.Cap != CapMemory || e.InUse != 512+OverheadMiB || e.Wanted != 512+OverheadMiB ||
		!strings.Contains(e.Error(), "running boxes take 640 MiB of host memory, 640 MiB more") {
		t.Errorf("second box of 512 MiB under 1100 MiB: %v", e)
	}
	if e := l.Start(u, 300); e != nil {
		t.Errorf("second box of 300 MiB under 1100 MiB (640+428 MiB): %v", e)
	}
}

func TestCapFill(t *testing.T) {
	l := Limits{Boxes: 3, MemoryMiB: 4096}
	if why := l.Fill(&Usage{Machines: 1, MemoryMiB: 256}, Pending{Filling: 1, Starting: 1}, 256); !strings.Contains(why, "at the host cap of 3 running boxes") || !strings.Contains(why, "1 run, 2 more") {
		t.Errorf("fill with 1 running and 2 in progress at a cap of 3: %q", why)
	}
	if why := l.Fill(&Usage{Machines: 1, MemoryMiB: 256}, Pending{Filling: 1, FillingMiB: 256}, 256); why != "" {
		t.Errorf("fill that fits: %q", why)
	}
	// 1 running (384 host MiB) + a fill of 2048 in progress (2176) + 1536
	// more (1664): 4224 > 4096.
	if why := l.Fill(&Usage{Machines: 1, MemoryMiB: 256}, Pending{Filling: 1, FillingMiB: 2048}, 1536); !strings.Contains(why, "running boxes take 384 MiB, 2176 MiB are being made or started, a pool box takes 1664 MiB") {
		t.Errorf("fill past the memory cap: %q", why)
	}
	if why := l.Fill(nil, Pending{}, 4000); !strings.Contains(why, "a pool box's 4000 MiB of memory") {
		t.Errorf("uncounted machines, a pool box larger than the cap: %q", why)
	}
	if why := l.Fill(nil, Pending{Filling: 9}, 256); why != "" {
		t.Errorf("uncounted machines, a pool box that fits alone: %q", why)
	}
}

func TestCapEvict(t *testing.T) {
	l := Limits{Boxes: 3, MemoryMiB: 4096}
	if !l.Evict(&Usage{Machines: 2}, 1, 0, 64) {
		t.Error("2 running and 1 starting at a cap of 3: want evict")
	}
	if l.Evict(&Usage{Machines: 1}, 1, 0, 64) {
		t.Error("1 running and 1 starting at a cap of 3: want no evict")
	}
	if !l.Evict(&Usage{Machines: 1, MemoryMiB: 2048}, 0, 0, 1900) {
		t.Error("2176+2028 MiB under 4096: want evict")
	}
	if l.Evict(&Usage{Machines: 2}, 5, 0, 4000) {
		t.Error("a box larger than the memory cap alone: evicting cannot help")
	}
	if l.Evict(nil, 5, 0, 64) {
		t.Error("uncounted machines: want no evict")
	}
}

func TestCapHome(t *testing.T) {
	if why := HomeFill(4, 2, 2); !strings.Contains(why, "at the home's limit of 4 boxes not stopped") || !strings.Contains(why, "2 boxes and 2 pool boxes") {
		t.Errorf("home full: %q", why)
	}
	if why := HomeFill(4, 2, 1); why != "" {
		t.Errorf("home with room: %q", why)
	}
	if why := HomeFill(0, 100, 100); why != "" {
		t.Errorf("no home budget: %q", why)
	}
	if !HomeFull(4, 3, 1) || HomeFull(4, 2, 1) || HomeFull(0, 9, 9) {
		t.Error("HomeFull: want full at 3+1+1 > 4 only")
	}
}
