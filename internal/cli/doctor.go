package cli

import (
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/assets"
	"github.com/airlock-run/airlock/internal/defaults"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/netstack"
	"github.com/airlock-run/airlock/internal/vmm/qemu"
)

func newDoctorCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "doctor",
		Short: "Check that this machine can run boxes, and say what to fix",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			out := cmd.OutOrStdout()
			problems := 0
			ok := func(what, detail string) { fmt.Fprintf(out, "ok       %-14s %s\n", what, detail) }
			bad := func(what, detail, fix string) {
				problems++
				fmt.Fprintf(out, "PROBLEM  %-14s %s\n         fix: %s\n", what, detail, fix)
			}
			note := func(what, detail string) { fmt.Fprintf(out, "note     %-14s %s\n", what, detail) }

			if p, err := exec.LookPath("qemu-system-x86_64"); err != nil {
				bad("qemu", "qemu-system-x86_64 not found", "apt-get install qemu-system-x86 (or run hack/setup.sh)")
			} else {
				v, _ := exec.Command(p, "--version").Output()
				ok("qemu", strings.SplitN(string(v), "\n", 2)[0])
			}
			accel, err := qemu.ProbeAccel(os.Getenv("AIRLOCK_ACCEL"))
			switch {
			case err != nil:
				bad("accelerator", err.Error(), "unset AIRLOCK_ACCEL or set AIRLOCK_ACCEL=tcg")
			case accel.Accel == qemu.AccelKVM:
				ok("accelerator", "KVM (hardware virtualization)")
			default:
				note("accelerator", "TCG software emulation: "+accel.Reason+"; boxes are slower and not a hardware boundary")
			}
			if k, kn, err := assets.FindKernel(""); err != nil {
				fix := "run hack/setup.sh (or hack/build-kernel.sh)"
				if v := os.Getenv("AIRLOCK_KERNEL"); v != "" {
					fix = "AIRLOCK_KERNEL=" + v + " is wrong: unset it to use the kernel hack/setup.sh installs, or point it at a vmlinux file"
				}
				bad("kernel", err.Error(), fix)
			} else {
				d := fmt.Sprintf("%s kernel %s at %s", k.Kind, k.Version, k.Path)
				if k.ConfigHash != "" {
					d += " (config " + k.ConfigHash[:min(12, len(k.ConfigHash))] + ")"
				}
				ok("kernel", d)
				if kn != "" {
					note("kernel", kn)
				}
				if k.Kind == assets.KernelAirlock && !k.VirtioFS && os.Getenv("AIRLOCK_VOLUME_TRANSPORT") == "virtiofs" {
					bad("kernel", "AIRLOCK_VOLUME_TRANSPORT=virtiofs, but this kernel has no virtio-fs (CONFIG_VIRTIO_FS)", "rebuild it: hack/build-kernel.sh (or unset AIRLOCK_VOLUME_TRANSPORT for 9p)")
				}
			}
			if p, err := assets.FindAgent(); err != nil && os.Getenv("AIRLOCK_AGENT") != "" {
				bad("agent", err.Error(), "AIRLOCK_AGENT is wrong: unset it to use the agent next to airlock, or point it at a static airlock-agent binary")
			} else if err != nil {
				bad("agent", err.Error(), "run hack/setup.sh, or build it: CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o $(dirname $(which airlock))/airlock-agent ./cmd/airlock-agent")
			} else if err := assets.CheckAgent(p); err != nil {
				bad("agent", err.Error(), "use the static agent hack/setup.sh builds (bin/airlock-agent); unset AIRLOCK_AGENT if it points elsewhere")
			} else {
				ok("agent", p)
			}
			if p, err := netstack.FindHelper(); err != nil {
				bad("network helper", err.Error(), "run hack/setup.sh, or build it: CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o $(dirname $(which airlock))/airlock-net ./cmd/airlock-net (boxes with --network none need none)")
			} else {
				ok("network helper", p)
			}
			for _, tool := range []string{"mkfs.erofs", "mkfs.ext4"} {
				if _, err := exec.LookPath(tool); err != nil {
					bad(tool, "not found", "apt-get install erofs-utils e2fsprogs")
				} else {
					ok(tool, "found")
				}
			}
			for _, p := range qemu.Protections(qemu.JailOptions{Off: defaults.Unconfined(), UIDRange: defaults.UIDRange()}) {
				switch {
				case p.On:
					ok(p.Name, p.Detail)
				case p.Problem:
					bad(p.Name, p.Detail, "see docs/confinement.md")
				default:
					note(p.Name, p.Detail)
				}
			}
			home := airlock.DefaultHome()
			dir := defaults.Images()
			if s, err := image.Open(dir); err != nil {
				bad("images", err.Error(), "check permissions of "+dir)
			} else if imgs, err := s.List(); err != nil {
				bad("images", err.Error(), "check "+dir)
			} else {
				found := false
				for _, im := range imgs {
					if im.Ref == "docker.io/library/"+airlock.DefaultImage {
						found = true
						ok("images", fmt.Sprintf("%d in %s; default %s: %s", len(imgs), dir, airlock.DefaultImage, im.Source))
					}
				}
				if !found {
					bad("images", "the default image "+airlock.DefaultImage+" is missing", "run hack/setup.sh, or 'airlock pull python:slim' where a registry is reachable")
				}
			}
			note("home", home)
			note("cache", defaults.Cache())
			if problems > 0 {
				fmt.Fprintf(out, "%d problem(s) found\n", problems)
				return &ExitError{1}
			}
			fmt.Fprintln(out, "ready to run boxes")
			return nil
		},
	}
}
