package cli

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// sizeFlag parses a size flag in MiB: "512m", "2g", "1.5g", "1048576k",
// "1t"; a bare number is MiB (as --memory always took). Units are binary
// (m = MiB); an optional "b" or "ib" may follow. "" is 0 (the default).
func sizeFlag(name, v string) (int, error) {
	if v == "" {
		return 0, nil
	}
	bad := fmt.Errorf("--%s %q: want a size such as 512m or 2g (a bare number is MiB)", name, v)
	s := strings.ToLower(strings.TrimSpace(v))
	s = strings.TrimSuffix(strings.TrimSuffix(s, "b"), "i")
	mult := 1.0
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'k':
			mult = 1.0 / 1024
		case 'm':
			mult = 1
		case 'g':
			mult = 1024
		case 't':
			mult = 1024 * 1024
		}
		if strings.IndexByte("kmgt", s[n-1]) >= 0 {
			s = s[:n-1]
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f <= 0 || f*mult > 1<<30 {
		return 0, bad
	}
	mib := int(f * mult)
	if mib < 1 {
		return 0, bad
	}
	return mib, nil
}

// hostMemMiB is this host's RAM in MiB (0 if unknown).
func hostMemMiB() int {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 0
	}
	return int(uint64(si.Totalram) * uint64(si.Unit) >> 20)
}

// checkMemory refuses guest memory the host does not have: QEMU would
// start, and the host would swap or kill it when the guest used it.
func checkMemory(mib int) error {
	if host := hostMemMiB(); host > 0 && mib > host {
		return fmt.Errorf("--memory %d MiB is more than this host's RAM (%d MiB): give at most %dm", mib, host, host)
	}
	return nil
}

// envFiles reads --env-file files as the Docker CLI does: one KEY=VALUE
// per line, blank lines and lines starting with # skipped, a bare KEY
// passing this process's value of KEY (nothing if unset). Values are taken
// as written (no quotes removed).
func envFiles(paths []string) ([]string, error) {
	var out []string
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, fmt.Errorf("--env-file: %w", err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		n := 0
		for sc.Scan() {
			n++
			line := strings.TrimLeft(sc.Text(), " \t")
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			kv, err := envFlags([]string{line})
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("--env-file %s line %d: want KEY=VALUE or KEY", p, n)
			}
			out = append(out, kv...)
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("--env-file %s: %w", p, err)
		}
	}
	return out, nil
}
