package airlock

import (
	"fmt"
	"os"

	"github.com/airlock-run/airlock/internal/defaults"
)

// DefaultHome returns $AIRLOCK_HOME, else ~/.airlock; "" when neither
// AIRLOCK_HOME nor HOME is set (Open then fails saying what to set).
func DefaultHome() string { return defaults.Home() }

// withDefaults fills the Options fields left zero, from the environment
// where the field's doc says so (internal/defaults is the one place that
// reads it).
func (o Options) withDefaults() (Options, error) {
	err := defaults.Runtime{Home: &o.Home, ImagesDir: &o.ImagesDir, CacheDir: &o.CacheDir, Accel: &o.Accel, THP: &o.THP,
		VolumeTransport: &o.VolumeTransport, Virtiofsd: &o.Virtiofsd, NetHelper: &o.NetHelper, DNSUpstream: &o.DNSUpstream,
		UIDRange: &o.UIDRange, Debug: &o.Debug, Unconfined: &o.Unconfined, ConsoleMax: &o.ConsoleMaxBytes,
		CPULimit: &o.CPULimit, MaxBoxes: &o.MaxBoxes, MaxMemoryMiB: &o.MaxMemoryMiB}.Fill()
	if o.Warn == nil {
		o.Warn = func(msg string) { fmt.Fprintln(os.Stderr, "airlock: warning: "+msg) }
	}
	return o, err
}
