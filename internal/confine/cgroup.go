package confine

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Limits are the host resources the processes of one cgroup may use (a
// box's QEMU, its network helper, its virtio-fs daemons).
type Limits struct {
	// MemoryBytes caps their memory, in bytes (QEMU: guest RAM plus its
	// own overhead, qemu.MemoryOverheadMiB); 0 = no cap.
	MemoryBytes int64
	// Pids caps their threads; 0 = no cap.
	Pids int
	// CPUs caps their CPU time, in host CPUs (1.5 = one and a half
	// cores); 0 = no cap.
	CPUs float64
}

// Cgroup is one cgroup of airlock's (a box's QEMU's, "box-ID"; its
// network helper's, "net-ID"; its virtio-fs daemons', "fs-ID"): a
// directory per controller hierarchy (cgroup v2: one directory; v1: one in
// each of the memory, pids and cpu hierarchies that are mounted), under
// an "airlock" group.
type Cgroup struct {
	// Dirs are the cgroup directories, created with the limits set.
	Dirs []string
	// name and limits remake it (Add); empty for one read back from a
	// file.
	name   string
	limits Limits
}

// CgroupSupport says which cgroup hierarchies this host offers for box
// limits (ProbeCgroups).
type CgroupSupport struct {
	// V2 is the cgroup v2 mount point ("" if none); V1 maps a v1 controller
	// (memory, pids, cpu) to its mount point.
	V2 string
	V1 map[string]string
	// V2Controllers are the controllers the v2 root offers.
	V2Controllers []string
}

// cgroupControllers are the controllers box limits use.
var cgroupControllers = []string{"memory", "pids", "cpu"}

// Controllers returns the controllers box limits use ("memory", "pids",
// "cpu") that the host offers, each as "NAME (v1)" or "NAME (v2)" (v1
// ones first, sorted), and those it lacks (for airlock doctor).
func (s CgroupSupport) Controllers() (have, missing []string) {
	_, _, missing = s.plan("probe")
	for c := range s.V1 {
		have = append(have, c+" (v1)")
	}
	sort.Strings(have)
	for _, c := range cgroupControllers {
		if _, ok := s.V1[c]; !ok && !slices.Contains(missing, c) {
			have = append(have, c+" (v2)")
		}
	}
	return have, missing
}

// ProbeCgroups reads /proc/self/mountinfo for cgroup hierarchies.
func ProbeCgroups() CgroupSupport {
	s := CgroupSupport{V1: map[string]string{}}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return s
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent maj:min root mountpoint opts ... - fstype source superopts
		l := sc.Text()
		i := strings.Index(l, " - ")
		if i < 0 {
			continue
		}
		pre, post := strings.Fields(l[:i]), strings.Fields(l[i+3:])
		if len(pre) < 5 || len(post) < 3 {
			continue
		}
		mp := pre[4]
		switch post[0] {
		case "cgroup2":
			if s.V2 == "" {
				s.V2 = mp
				b, _ := os.ReadFile(filepath.Join(mp, "cgroup.controllers"))
				s.V2Controllers = strings.Fields(string(b))
			}
		case "cgroup":
			for _, o := range strings.Split(post[2], ",") {
				for _, c := range cgroupControllers {
					if o == c {
						if _, ok := s.V1[c]; !ok {
							s.V1[c] = mp
						}
					}
				}
			}
		}
	}
	return s
}

// ownCgroup returns this process's cgroup path in the v1 hierarchy of
// controller (controller "" = the v2 hierarchy).
func ownCgroup(controller string) string {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "/"
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		if controller == "" && f[0] == "0" && f[1] == "" {
			return f[2]
		}
		if controller != "" {
			for _, c := range strings.Split(f[1], ",") {
				if c == controller {
					return f[2]
				}
			}
		}
	}
	return "/"
}

// plan returns, for each controller, the hierarchy directory a box cgroup
// named name goes into: v1 where the controller has a v1 hierarchy (under
// this process's own cgroup there, so limits above it still apply), else
// v2 (under the v2 root's airlock group; only root can set that up).
func (s CgroupSupport) plan(name string) (v1 map[string]string, v2 string, missing []string) {
	v1 = map[string]string{}
	for _, c := range cgroupControllers {
		if mp, ok := s.V1[c]; ok {
			v1[c] = filepath.Join(mp, ownCgroup(c), "airlock", name)
			continue
		}
		has := false
		for _, x := range s.V2Controllers {
			if x == c {
				has = true
			}
		}
		if has && s.V2 != "" {
			v2 = filepath.Join(s.V2, "airlock", name)
		} else {
			missing = append(missing, c)
		}
	}
	return v1, v2, missing
}

// NewCgroup creates the cgroup name (see Cgroup) with limits l: cgroup v2 where
// the host has the controllers there, v1 controllers otherwise. It needs
// write access to the hierarchies (root). Controllers the host lacks are
// skipped and named in the error only if none could be used.
//
// The cpu controller is used only with a CPU limit (l.CPUs > 0). Without
// one it would only group the process: every box of the host under one
// "airlock" group, which the scheduler weighs as one task against each
// process outside it, so that under load a box waited for the CPU longer
// than an unconfined one (+0.8 ms exec round trip, docs/confinement.md
// "Cost").
func NewCgroup(name string, l Limits) (*Cgroup, error) {
	s := ProbeCgroups()
	v1, v2, missing := s.plan(name)
	g := &Cgroup{}
	set := func(dir, file, val string) error {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(val), 0o644); err != nil {
			return fmt.Errorf("cgroup %s: %w", file, err)
		}
		return nil
	}
	fail := func(err error) (*Cgroup, error) {
		g.Remove()
		return nil, err
	}
	for _, c := range cgroupControllers {
		dir, ok := v1[c]
		if !ok || c == "cpu" && l.CPUs <= 0 {
			continue // see NewCgroup
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fail(fmt.Errorf("cgroup: %w", err))
		}
		g.Dirs = append(g.Dirs, dir)
		var err error
		switch c {
		case "memory":
			if l.MemoryBytes > 0 {
				err = set(dir, "memory.limit_in_bytes", strconv.FormatInt(l.MemoryBytes, 10))
			}
		case "pids":
			if l.Pids > 0 {
				err = set(dir, "pids.max", strconv.Itoa(l.Pids))
			}
		case "cpu":
			if l.CPUs > 0 {
				if err = set(dir, "cpu.cfs_period_us", "100000"); err == nil {
					err = set(dir, "cpu.cfs_quota_us", strconv.Itoa(int(l.CPUs*100000)))
				}
			}
		}
		if err != nil {
			return fail(err)
		}
	}
	if v2 != "" {
		parent := filepath.Dir(v2)
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return fail(fmt.Errorf("cgroup: %w", err))
		}
		var want []string
		for _, c := range cgroupControllers {
			if _, ok := v1[c]; !ok && (c != "cpu" || l.CPUs > 0) {
				want = append(want, "+"+c)
			}
		}
		// The root's and the airlock group's subtree_control must pass
		// the controllers down (the airlock group has no processes).
		for _, d := range []string{s.V2, parent} {
			for _, w := range want {
				os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte(w), 0o644)
			}
		}
		if err := os.Mkdir(v2, 0o755); err != nil && !os.IsExist(err) {
			return fail(fmt.Errorf("cgroup: %w", err))
		}
		g.Dirs = append(g.Dirs, v2)
		b, _ := os.ReadFile(filepath.Join(v2, "cgroup.controllers"))
		have := " " + string(b) + " "
		if strings.Contains(have, " memory ") && l.MemoryBytes > 0 {
			if err := set(v2, "memory.max", strconv.FormatInt(l.MemoryBytes, 10)); err != nil {
				return fail(err)
			}
			set(v2, "memory.swap.max", "0")
		}
		if strings.Contains(have, " pids ") && l.Pids > 0 {
			if err := set(v2, "pids.max", strconv.Itoa(l.Pids)); err != nil {
				return fail(err)
			}
		}
		if strings.Contains(have, " cpu ") && l.CPUs > 0 {
			if err := set(v2, "cpu.max", strconv.Itoa(int(l.CPUs*100000))+" 100000"); err != nil {
				return fail(err)
			}
		}
	}
	if len(g.Dirs) == 0 {
		return nil, fmt.Errorf("cgroup: no usable hierarchy for %s", strings.Join(missing, ", "))
	}
	g.name, g.limits = name, l
	return g, nil
}

// Add moves process pid (all its threads) into the cgroup. A cgroup
// removed since it was made is made again first: a cgroup is named after
// its box, and another process that watched the box's previous boot end
// removes that boot's cgroup, of the same name, when it notices (an
// airlock serve watching a box that the CLI paused to disk and resumes).
func (g *Cgroup) Add(pid int) error {
	err := g.add(pid)
	if errors.Is(err, fs.ErrNotExist) && g.name != "" {
		if again, e := NewCgroup(g.name, g.limits); e == nil {
			g.Dirs = again.Dirs
			err = g.add(pid)
		}
	}
	return err
}

func (g *Cgroup) add(pid int) error {
	for _, d := range g.Dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("cgroup %s: add pid %d: %w", d, pid, err)
		}
	}
	return nil
}

// Remove deletes the cgroup's directories once their processes are gone
// (waiting up to a second for an exiting process to leave).
func (g *Cgroup) Remove() error {
	if g == nil {
		return nil
	}
	var errs []error
	for _, d := range g.Dirs {
		deadline := time.Now().Add(time.Second)
		for {
			err := os.Remove(d)
			if err == nil || os.IsNotExist(err) {
				break
			}
			if time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return errors.Join(errs...)
}

// SaveCgroup records g's directories in file (one per line), for
// RemoveSavedCgroup from any process.
func SaveCgroup(file string, g *Cgroup) error {
	return os.WriteFile(file, []byte(strings.Join(g.Dirs, "\n")+"\n"), 0o600)
}

// RemoveSavedCgroup removes the cgroup recorded in file, and file. Only
// directories inside a cgroup hierarchy's airlock group are removed.
func RemoveSavedCgroup(file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	g := &Cgroup{}
	for _, l := range strings.Split(string(b), "\n") {
		// Cleaned first: "/sys/fs/cgroup/../../x/airlock/y" is no cgroup.
		if l = filepath.Clean(strings.TrimSpace(l)); l != "" && strings.HasPrefix(l, "/sys/fs/cgroup/") && filepath.Base(filepath.Dir(l)) == "airlock" {
			g.Dirs = append(g.Dirs, l)
		}
	}
	err = g.Remove()
	if err == nil {
		os.Remove(file)
	}
	return err
}
