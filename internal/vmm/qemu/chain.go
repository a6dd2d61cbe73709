package qemu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"

	"github.com/airlock-run/airlock/internal/checkpoint/pagediff"
)

// A checkpoint (vmm.SaveOptions.Chain) keeps its RAM image and writable
// layer as page-delta chains (internal/checkpoint/pagediff): each holds
// per-page hashes, and one whose parent (the box's previous checkpoint)
// is usable stores only the pages whose hash differs from the parent's.
// While the machine is stopped every allocated page of QEMU's RAM memfd
// and of the layer is read and hashed on all CPUs (there is no dirty-page
// tracking to ask: the host kernel has no soft-dirty bits, and QEMU's
// dirty log would need a migration to run); the changed pages are
// written. A restore (StartFromSnapshot, CreateFromSnapshot) fills the
// box's RAM memfd and its layer from the chain, each page from the newest
// link that holds it.

// parentSums are the page sums of a checkpoint's parent, read before
// the machine stops (they take a few MiB: not in the paused time).
type parentSums struct {
	ram, disk *pagediff.Sums
}

// readParentSums reads the sums of the snapshot in parent ("" none) that
// a checkpoint of a machine with RAM parts idx (of parts) and the layer
// at layer can be a delta against; one it cannot use is nil.
func readParentSums(parent string, parts []ramPart, idx []int, layer string) parentSums {
	var ps parentSums
	if parent == "" {
		return ps
	}
	if mm, err := readMeta(parent); err == nil && !mm.Transient && len(idx) > 0 && reflect.DeepEqual(mm.RAMParts, idx) {
		ps.ram, _ = pagediff.ReadSums(filepath.Join(parent, pagediff.SumsName(snapRAM)), partOffset(parts, len(parts)))
	}
	if fi, err := os.Stat(layer); err == nil {
		ps.disk, _ = pagediff.ReadSums(filepath.Join(parent, pagediff.SumsName(snapDisk)), fi.Size())
	}
	return ps
}

// saveRAMDelta writes the RAM image of QEMU's memfds into dir as a chain
// link: a delta against parent (the parent's sums) where there is one,
// else whole. It returns the image's sums.
func saveRAMDelta(dir string, parts []ramPart, memfds map[int]*os.File, parent *pagediff.Sums) (*pagediff.Sums, error) {
	total := partOffset(parts, len(parts))
	var segs []pagediff.Segment
	for i, f := range memfds {
		segs = append(segs, pagediff.Segment{Src: f, Off: partOffset(parts, i), Size: int64(parts[i].sizeMiB) << 20})
	}
	s, _, err := pagediff.Save(filepath.Join(dir, snapRAM), total, segs, parent, pagediff.NewSeed(), runtime.NumCPU())
	return s, err
}

// saveLayerDelta writes the writable layer at layer into dir as a chain
// link (a delta against parent's sums where they are of its size).
func saveLayerDelta(dir, layer string, parent *pagediff.Sums) (*pagediff.Sums, bool, error) {
	f, err := os.Open(layer)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, false, err
	}
	if parent != nil && parent.Size != fi.Size() {
		parent = nil
	}
	s, _, err := pagediff.Save(filepath.Join(dir, snapDisk), fi.Size(), []pagediff.Segment{{Src: f, Size: fi.Size()}}, parent, pagediff.NewSeed(), runtime.NumCPU())
	return s, parent != nil, err
}

// writeChain writes a checkpoint's sums and its link to parent (for the
// images that are deltas), and makes them durable with the layer's copy.
func writeChain(dir, parent string, ramSums, diskSums *pagediff.Sums, ramDelta, diskDelta bool) error {
	var l pagediff.Link
	for _, x := range []struct {
		name  string
		sums  *pagediff.Sums
		delta bool
	}{{snapRAM, ramSums, ramDelta}, {snapDisk, diskSums, diskDelta}} {
		if x.sums == nil {
			continue
		}
		p := filepath.Join(dir, pagediff.SumsName(x.name))
		if err := pagediff.WriteSums(p, x.sums); err != nil {
			return err
		}
		if err := syncFile(p); err != nil {
			return err
		}
		if x.delta {
			l.Deltas = append(l.Deltas, x.name)
		}
	}
	if diskSums != nil {
		if err := syncFile(filepath.Join(dir, snapDisk)); err != nil {
			return err
		}
	}
	if len(l.Deltas) == 0 {
		return nil
	}
	l.Parent = filepath.Base(parent)
	return pagediff.WriteLink(dir, l)
}

// checkChain checks that the parents the snapshot in dir needs are there.
func checkChain(dir string) error {
	for _, name := range []string{snapRAM, snapDisk} {
		if _, err := pagediff.Chain(dir, name); err != nil {
			return fmt.Errorf("snapshot %s cannot be restored: %w", filepath.Base(dir), err)
		}
	}
	return nil
}

// materialiseLayer writes the writable layer of the snapshot in dir,
// a delta, to the new file layer.
func materialiseLayer(ctx context.Context, dir, layer string) error {
	chain, err := pagediff.Chain(dir, snapDisk)
	if err != nil {
		return err
	}
	fi, err := os.Stat(filepath.Join(dir, snapDisk))
	if err != nil {
		return err
	}
	out, err := os.OpenFile(layer, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if err := out.Truncate(fi.Size()); err != nil {
		out.Close()
		return err
	}
	_, err = pagediff.Materialise(out, chain, snapDisk, fi.Size(), 0, fi.Size())
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(layer)
		return fmt.Errorf("materialise the checkpoint's writable layer: %w", err)
	}
	return nil
}

// ramCopyChain is ramCopy for a snapshot whose RAM image is a delta: each
// part's memfd is filled from the chain, in the background (filled waits).
func ramCopyChain(dir string, parts []ramPart, idx []int) (files []*os.File, filled func() error, err error) {
	chain, err := pagediff.Chain(dir, snapRAM)
	if err != nil {
		return nil, nil, err
	}
	total := partOffset(parts, len(parts))
	return fillInBackground(parts, idx, func(dst *os.File, i int) error {
		if _, err := pagediff.Materialise(dst, chain, snapRAM, total, partOffset(parts, i), int64(parts[i].sizeMiB)<<20); err != nil {
			return fmt.Errorf("load the checkpoint's RAM image: %w", err)
		}
		return nil
	}, func() {})
}
