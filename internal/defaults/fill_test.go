package defaults

import (
	"path/filepath"
	"testing"
)

// TestFillTakesTheEnvironmentForZeroSettingsOnly: a setting given is
// kept; one left zero comes from its variable; a bad value is an error
// naming the variable.
func TestFillTakesTheEnvironmentForZeroSettingsOnly(t *testing.T) {
	home := t.TempDir()
	t.Setenv("AIRLOCK_HOME", home)
	t.Setenv("AIRLOCK_IMAGES", "")
	t.Setenv("AIRLOCK_ACCEL", "tcg")
	t.Setenv("AIRLOCK_DEBUG", "1")
	t.Setenv("AIRLOCK_CONFINE", "off")
	t.Setenv("AIRLOCK_MAX_BOXES", "7")
	t.Setenv("AIRLOCK_MAX_MEMORY", "")
	t.Setenv("AIRLOCK_CPU_LIMIT", "")
	t.Setenv("AIRLOCK_CONSOLE_MAX", "")
	var accel, imgs, thp, vt, vfs, nh, dns, uids, cache string
	var h string
	var debug, unconfined bool
	var consoleMax int64
	var cpu float64
	maxBoxes, maxMem := 0, 100
	thp = "off"
	s := Runtime{Home: &h, ImagesDir: &imgs, CacheDir: &cache, Accel: &accel, THP: &thp, VolumeTransport: &vt, Virtiofsd: &vfs,
		NetHelper: &nh, DNSUpstream: &dns, UIDRange: &uids, Debug: &debug, Unconfined: &unconfined, ConsoleMax: &consoleMax,
		CPULimit: &cpu, MaxBoxes: &maxBoxes, MaxMemoryMiB: &maxMem}
	if err := s.Fill(); err != nil {
		t.Fatal(err)
	}
	if h != home || imgs != filepath.Join(home, "images") || accel != "tcg" || thp != "off" || !debug || !unconfined || maxBoxes != 7 || maxMem != 100 {
		t.Errorf("filled: home %q images %q accel %q thp %q debug %v unconfined %v boxes %d mem %d", h, imgs, accel, thp, debug, unconfined, maxBoxes, maxMem)
	}
	t.Setenv("AIRLOCK_CPU_LIMIT", "lots")
	cpu = 0
	if err := s.Fill(); err == nil {
		t.Error("AIRLOCK_CPU_LIMIT=lots accepted")
	}
}
