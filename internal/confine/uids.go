package confine

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gofrs/flock"
)

// UIDRangeOwner is the /etc/subuid (and /etc/subgid) entry whose range
// holds the uids boxes' processes (QEMU, the network helper, commit's
// disk tools) run as when airlock runs as root; hack/setup.sh
// reserves "airlock:<start>:65536". AIRLOCK_UID_RANGE=start:count
// overrides it.
const UIDRangeOwner = "airlock"

// UIDRange is a range of host uids (and the gids of the same numbers).
type UIDRange struct {
	Start, Count int
	// Source says where the range came from ("/etc/subuid",
	// "AIRLOCK_UID_RANGE").
	Source string
}

// BoxUIDRange returns the range box processes take their uids from: v
// ("START:COUNT", from Options.UIDRange or AIRLOCK_UID_RANGE) when set,
// else the UIDRangeOwner entry of /etc/subuid; or an error saying how to
// reserve one.
func BoxUIDRange(v string) (UIDRange, error) {
	if v != "" {
		r, err := parseRange(v)
		if err != nil {
			return UIDRange{}, fmt.Errorf("uid range %q (Options.UIDRange, or AIRLOCK_UID_RANGE): %w (want START:COUNT)", v, err)
		}
		r.Source = "AIRLOCK_UID_RANGE"
		return r, nil
	}
	r, err := subidRange("/etc/subuid", UIDRangeOwner)
	if err != nil {
		return UIDRange{}, err
	}
	if _, err := subidRange("/etc/subgid", UIDRangeOwner); err != nil {
		return UIDRange{}, err
	}
	r.Source = "/etc/subuid"
	return r, nil
}

func parseRange(v string) (UIDRange, error) {
	a, b, ok := strings.Cut(v, ":")
	if !ok {
		return UIDRange{}, fmt.Errorf("no colon")
	}
	start, err1 := strconv.Atoi(a)
	n, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil || start < 1000 || n < 1 || start+n > 1<<32-2 {
		return UIDRange{}, fmt.Errorf("bad range")
	}
	return UIDRange{Start: start, Count: n}, nil
}

func subidRange(file, owner string) (UIDRange, error) {
	f, err := os.Open(file)
	if err != nil {
		return UIDRange{}, fmt.Errorf("no box uid range: %v (run hack/setup.sh, which adds %q to /etc/subuid and /etc/subgid, or set AIRLOCK_UID_RANGE=START:COUNT)", err, owner)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if ok && name == owner {
			return parseRange(rest)
		}
	}
	return UIDRange{}, fmt.Errorf("no box uid range: %s has no %q entry (run hack/setup.sh, or set AIRLOCK_UID_RANGE=START:COUNT)", file, owner)
}

// uidClaimDir holds a file per uid handed out in the last minutes, so that
// two boxes starting at once do not pick the same uid before either
// process runs as it.
const uidClaimDir = "/run/airlock/uids"

// claimTTL is how long a claim protects a uid no process runs as yet.
const claimTTL = 2 * time.Minute

// AllocUID picks a uid of r that no process runs as and no recent claim
// holds, and claims it. Root only.
func AllocUID(r UIDRange) (int, error) {
	if err := os.MkdirAll(uidClaimDir, 0o700); err != nil {
		return 0, fmt.Errorf("box uid: %w", err)
	}
	l := flock.New(filepath.Join(filepath.Dir(uidClaimDir), "uids.lock"))
	if err := l.Lock(); err != nil {
		return 0, fmt.Errorf("box uid: %w", err)
	}
	defer l.Unlock()
	used := procUIDs()
	ents, _ := os.ReadDir(uidClaimDir)
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			continue
		}
		if time.Since(fi.ModTime()) > claimTTL {
			os.Remove(filepath.Join(uidClaimDir, e.Name()))
			continue
		}
		if n, err := strconv.Atoi(e.Name()); err == nil {
			used[n] = true
		}
	}
	off := rand.IntN(r.Count)
	for i := 0; i < r.Count; i++ {
		uid := r.Start + (off+i)%r.Count
		if used[uid] {
			continue
		}
		if err := os.WriteFile(filepath.Join(uidClaimDir, strconv.Itoa(uid)), nil, 0o600); err != nil {
			return 0, fmt.Errorf("box uid: %w", err)
		}
		return uid, nil
	}
	return 0, fmt.Errorf("box uid: all %d uids of the range %d-%d are in use", r.Count, r.Start, r.Start+r.Count-1)
}

// AllocBoxUID claims a free uid, as AllocUID does, of the box uid range
// spec names ("START:COUNT", or "" for the /etc/subuid entry: see
// BoxUIDRange).
func AllocBoxUID(spec string) (int, error) {
	r, err := BoxUIDRange(spec)
	if err != nil {
		return 0, err
	}
	return AllocUID(r)
}

// procUIDs returns every uid and gid (real, effective, saved and file
// system) any process runs as, from the Uid: and Gid: lines of
// /proc/PID/status. Not the owner of /proc/PID: a process that changed its
// uid without an exec (the network helper, the console drainer) is not
// dumpable, and its /proc/PID belongs to root. (Box uids and gids are the
// same numbers, so a gid in use holds its uid too.)
func procUIDs() map[int]bool {
	used := map[int]bool{}
	ents, _ := os.ReadDir("/proc")
	buf := make([]byte, 4096)
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		for _, id := range statusIDs("/proc/"+e.Name()+"/status", buf) {
			used[id] = true
		}
	}
	return used
}

// statusIDs returns the uids and gids on the Uid: and Gid: lines of a
// /proc/PID/status file (nil if it cannot be read: the process is gone).
func statusIDs(path string, buf []byte) []int {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	n, _ := io.ReadFull(f, buf)
	f.Close()
	var ids []int
	for _, l := range strings.Split(string(buf[:n]), "\n") {
		rest, ok := strings.CutPrefix(l, "Uid:")
		if !ok {
			rest, ok = strings.CutPrefix(l, "Gid:")
		}
		if !ok {
			continue
		}
		for _, f := range strings.Fields(rest) {
			if id, err := strconv.Atoi(f); err == nil {
				ids = append(ids, id)
			}
		}
	}
	return ids
}
