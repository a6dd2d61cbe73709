package qemu

import (
	"os"
	"path/filepath"
)

// SaveRAMImageForTest writes the RAM image of running QEMU pid, started
// with c, into dir (as SaveSnapshot does) and returns the memfd parts it
// holds.
func SaveRAMImageForTest(pid int, c Config, dir string) ([]int, error) {
	parts, idx := imageParts(c)
	memfds, err := qemuMemfds(pid, parts, idx)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, f := range memfds {
			f.Close()
		}
	}()
	_, err = writeRAMImage(filepath.Join(dir, snapRAM), parts, memfds)
	return idx, err
}

// SealedRAMImagesForTest returns sealed copies of the RAM memfds of
// running QEMU pid, started with c (as SaveSnapshot makes them for a
// transient snapshot and Fork's children map them), and the parts they
// hold.
func SealedRAMImagesForTest(pid int, c Config) ([]*os.File, []int, error) {
	parts, idx := imageParts(c)
	memfds, err := qemuMemfds(pid, parts, idx)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		for _, f := range memfds {
			f.Close()
		}
	}()
	files, _, err := sealedCopies(parts, memfds)
	return files, idx, err
}
