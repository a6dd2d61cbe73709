package defaults

// Runtime points at the settings of an airlock runtime that the
// environment may give (the fields of airlock.Options whose docs name a
// variable); Fill sets those left zero.
type Runtime struct {
	Home, ImagesDir, CacheDir, Accel, THP, VolumeTransport, Virtiofsd, NetHelper, DNSUpstream, UIDRange *string
	Debug, Unconfined                                                                                   *bool
	ConsoleMax                                                                                          *int64
	CPULimit                                                                                            *float64
	MaxBoxes, MaxMemoryMiB                                                                              *int
}

// Fill sets each setting of s that is zero from the environment, as the
// functions of this package read it: Home first, then ImagesDir in it. A
// variable whose value cannot be used is an error saying what it wants.
func (s Runtime) Fill() error {
	str := func(p *string, f func() string) {
		if *p == "" {
			*p = f()
		}
	}
	str(s.Home, Home)
	str(s.ImagesDir, func() string { return ImagesIn(*s.Home) })
	str(s.CacheDir, Cache)
	str(s.Accel, Accel)
	str(s.THP, THP)
	str(s.VolumeTransport, VolumeTransport)
	str(s.Virtiofsd, Virtiofsd)
	str(s.NetHelper, NetHelper)
	str(s.DNSUpstream, DNSUpstream)
	str(s.UIDRange, UIDRange)
	*s.Debug = *s.Debug || Debug()
	*s.Unconfined = *s.Unconfined || Unconfined()
	var err error
	if *s.ConsoleMax == 0 {
		if *s.ConsoleMax, err = ConsoleMax(); err != nil {
			return err
		}
	}
	if *s.CPULimit == 0 {
		if *s.CPULimit, err = CPULimit(); err != nil {
			return err
		}
	}
	if *s.MaxBoxes == 0 {
		if *s.MaxBoxes, err = MaxBoxes(); err != nil {
			return err
		}
	}
	if *s.MaxMemoryMiB == 0 {
		if *s.MaxMemoryMiB, err = MaxMemory(); err != nil {
			return err
		}
	}
	return nil
}
