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
	if o.Home == "" {
		o.Home = defaults.Home()
	}
	if o.ImagesDir == "" {
		o.ImagesDir = defaults.ImagesIn(o.Home)
	}
	if o.CacheDir == "" {
		o.CacheDir = defaults.Cache()
	}
	if o.Accel == "" {
		o.Accel = defaults.Accel()
	}
	if o.THP == "" {
		o.THP = defaults.THP()
	}
	if o.VolumeTransport == "" {
		o.VolumeTransport = defaults.VolumeTransport()
	}
	if o.Virtiofsd == "" {
		o.Virtiofsd = defaults.Virtiofsd()
	}
	if o.NetHelper == "" {
		o.NetHelper = defaults.NetHelper()
	}
	if o.DNSUpstream == "" {
		o.DNSUpstream = defaults.DNSUpstream()
	}
	if !o.Debug {
		o.Debug = defaults.Debug()
	}
	if o.Warn == nil {
		o.Warn = func(msg string) { fmt.Fprintln(os.Stderr, "airlock: warning: "+msg) }
	}
	var err error
	if !o.Unconfined {
		o.Unconfined = defaults.Unconfined()
	}
	if o.ConsoleMaxBytes == 0 {
		if o.ConsoleMaxBytes, err = defaults.ConsoleMax(); err != nil {
			return o, err
		}
	}
	if o.CPULimit == 0 {
		if o.CPULimit, err = defaults.CPULimit(); err != nil {
			return o, err
		}
	}
	if o.UIDRange == "" {
		o.UIDRange = defaults.UIDRange()
	}
	if o.MaxBoxes == 0 {
		if o.MaxBoxes, err = defaults.MaxBoxes(); err != nil {
			return o, err
		}
	}
	if o.MaxMemoryMiB == 0 {
		if o.MaxMemoryMiB, err = defaults.MaxMemory(); err != nil {
			return o, err
		}
	}
	return o, nil
}
