// Command build-debian builds a Debian-based image into an airlock image
// store with imagebuild.BuildDebian, and optionally its rootfs base.
//
//	go run ./internal/imagebuild/cmd/build-debian -tag python:slim \
//	    -packages python3,python3-pip,ca-certificates,procps -rootfs
//
// It is a stop-gap until the airlock CLI has 'airlock image build-debian'.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"

	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/imagebuild"
	"github.com/airlock-run/airlock/internal/rootfs"
)

func main() {
	var (
		tag      = flag.String("tag", "python:slim", "image name to store the result under")
		packages = flag.String("packages", "python3,python3-pip,ca-certificates,procps", "comma-separated Debian packages")
		suite    = flag.String("suite", imagebuild.DefaultSuite, "Debian suite")
		mirror   = flag.String("mirror", "", "apt mirror URI (default: deb.debian.org with updates and security)")
		store    = flag.String("store", "", "image store directory (default $AIRLOCK_HOME/images)")
		cache    = flag.String("cache", "", "cache directory for -rootfs (default $AIRLOCK_CACHE or ~/.cache/airlock)")
		base     = flag.Bool("rootfs", false, "also build the erofs rootfs base and print its path")
		keepDocs = flag.Bool("keep-docs", false, "keep /usr/share/doc, man pages and locales")
	)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *tag, *packages, *suite, *mirror, *store, *cache, *base, *keepDocs); err != nil {
		fmt.Fprintln(os.Stderr, "build-debian:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, tag, packages, suite, mirror, storeDir, cacheDir string, base, keepDocs bool) error {
	s, err := image.Open(storeDir)
	if err != nil {
		return err
	}
	var pkgs []string
	for _, p := range strings.Split(packages, ",") {
		if p = strings.TrimSpace(p); p != "" {
			pkgs = append(pkgs, p)
		}
	}
	img, err := imagebuild.BuildDebian(ctx, s, imagebuild.DebianOptions{
		Suite: suite, Packages: pkgs, Tag: tag, Mirror: mirror, KeepDocs: keepDocs, Progress: os.Stderr,
	})
	if err != nil {
		return err
	}
	fmt.Printf("image %s %s in %s\nsource: %s\n", img.Ref, img.Digest, s.Dir(), img.Source)
	if base {
		p, err := rootfs.BaseWith(ctx, s, img, cacheDir, rootfs.BaseOptions{Note: func(m string) { fmt.Fprintln(os.Stderr, m) }})
		if err != nil {
			return err
		}
		fmt.Printf("rootfs base %s\n", p)
	}
	return nil
}
