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

// SharedRAMImagesForTest returns the sealed memfds a restore of c from the
// RAM image in dir maps (as StartFromSnapshot under WithSharedRAM).
func SharedRAMImagesForTest(c Config, dir string) ([]*os.File, func(), error) {
	parts, idx := imageParts(c)
	return ramImages.get(filepath.Join(dir, snapRAM), parts, idx)
}
