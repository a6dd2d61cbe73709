package rootfs_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/compression"
	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/imagetest"
	"github.com/airlock-run/airlock/internal/image/unpack"
	"github.com/airlock-run/airlock/internal/rootfs"
)

// rawHeader returns one 512-byte tar header block of type typ: the tar
// writer refuses what hostile layers need (GNU sparse PAX records).
func rawHeader(name string, typ byte, size int64) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Size: size, Mode: 0o644, Format: tar.FormatUSTAR})
	b := append([]byte(nil), buf.Bytes()[:512]...)
	b[156] = typ
	copy(b[148:156], "        ")
	var sum int64
	for _, c := range b {
		sum += int64(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

func pad512(b []byte) []byte {
	if r := len(b) % 512; r != 0 {
		b = append(b, make([]byte, 512-r)...)
	}
	return b
}

func paxRecord(k, v string) string {
	s := " " + k + "=" + v + "\n"
	for n := len(s); ; {
		if l := len(strconv.Itoa(n)) + len(s); l == n {
			return strconv.Itoa(n) + s
		} else {
			n = l
		}
	}
}

// sparseTar is a layer holding one GNU sparse (PAX 1.0) file of realSize
// bytes whose only data is data at offset off; the rest is a hole.
func sparseTar(name string, realSize, off int64, data string) []byte {
	recs := paxRecord("GNU.sparse.major", "1") + paxRecord("GNU.sparse.minor", "0") +
		paxRecord("GNU.sparse.name", name) + paxRecord("GNU.sparse.realsize", strconv.FormatInt(realSize, 10))
	sm := "0\n"
	if data != "" {
		sm = fmt.Sprintf("1\n%d\n%d\n", off, len(data))
	}
	var out []byte
	out = append(out, rawHeader("PaxHeaders/"+name, 'x', int64(len(recs)))...)
	out = append(out, pad512([]byte(recs))...)
	out = append(out, rawHeader("GNUSparseFile.0/"+name, '0', int64(512+len(data)))...)
	out = append(out, pad512([]byte(sm))...)
	out = append(out, pad512([]byte(data))...)
	return append(out, make([]byte, 1024)...)
}

// zeroFiles is a layer of n files of size bytes of zeros each: compressed,
// it is a few KiB.
func zeroFiles(n int, size int64) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	zero := make([]byte, size)
	for i := 0; i < n; i++ {
		tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("z/%d", i), Typeflag: tar.TypeReg, Size: size, Mode: 0o644})
		tw.Write(zero)
	}
	tw.Close()
	return buf.Bytes()
}

// Hostile images, pulled from a loopback registry like any image, fail to
// build a base with an error naming what they broke, and leave nothing in
// the cache and nothing outside it.
func TestHostileImagesLeaveNothing(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	s, err := image.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	var manyEntries []imagetest.Entry
	for i := 0; i < 3000; i++ {
		manyEntries = append(manyEntries, imagetest.Entry{Name: fmt.Sprintf("e/%d", i)})
	}
	small := unpack.Limits{MaxBytes: 16 << 20, MaxEntries: 2000}
	for _, tc := range []struct {
		name   string
		comp   compression.Compression
		layer  []byte
		limits unpack.Limits
		want   error
		msg    string
	}{
		{"sparse bomb", compression.GZip, sparseTar("bomb", 1<<50, 0, ""), unpack.Limits{}, unpack.ErrLimit, "declares 1.0 PiB, over the per-file limit"},
		{"entry bomb", compression.GZip, imagetest.Tar(t, manyEntries...), small, unpack.ErrLimit, "more than 2000 entries (MaxEntries"},
		{"gzip bomb of zeros", compression.GZip, zeroFiles(1, 64<<20), small, unpack.ErrLimit, "over the per-file limit of 16 MiB"},
		{"zstd bomb of zeros", compression.ZStd, zeroFiles(8, 4<<20), small, unpack.ErrLimit, "files total more than 16 MiB"},
		{"dotdot", compression.GZip, imagetest.Tar(t, imagetest.Entry{Name: "../../victim", Body: "pwned"}), unpack.Limits{}, unpack.ErrUnsafePath, "leaves the root"},
		{"symlink escape", compression.GZip, imagetest.Tar(t,
			imagetest.Entry{Name: "esc", Type: tar.TypeSymlink, Linkname: outside},
			imagetest.Entry{Name: "esc/pwned", Body: "pwned"},
			imagetest.Entry{Name: "hl", Type: tar.TypeLink, Linkname: "esc/../../../../etc/passwd"}), unpack.Limits{}, unpack.ErrUnsafePath, "hard link hl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref := reg.Push(t, "hostile/"+strings.ReplaceAll(tc.name, " ", "-")+":v1", imagetest.ImageCompressed(t, tc.comp, []string{"/bin/sh"}, tc.layer))
			img, err := s.Pull(context.Background(), ref, image.PullOptions{})
			if err != nil {
				t.Fatal(err)
			}
			cache := t.TempDir()
			_, err = rootfs.BaseWith(context.Background(), s, img, cache, rootfs.BaseOptions{Limits: tc.limits})
			// In the symlink case what goes through the link stays inside
			// the root, and the hard link out is refused.
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v, want %v with %q", err, tc.want, tc.msg)
			}
			t.Logf("%v", err)
			left, _ := filepath.Glob(filepath.Join(cache, "rootfs", "*"))
			for _, p := range left {
				if !strings.HasSuffix(p, ".lock") {
					t.Errorf("left in the cache: %s", p)
				}
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Errorf("written outside the root: %v", ents)
			}
		})
	}
}

// A sparse entry within the limits is written with its hole: it takes
// almost no disk.
func TestSparseEntryKeepsItsHole(t *testing.T) {
	root := t.TempDir()
	err := unpack.Apply(context.Background(), root, bytes.NewReader(sparseTar("holey", 256<<20, 100<<20, "data")), unpack.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(root, "holey")
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	f, _ := os.Open(p)
	f.ReadAt(b, 100<<20)
	f.Close()
	if fi.Size() != 256<<20 || string(b) != "data" {
		t.Fatalf("size %d, data %q", fi.Size(), b)
	}
	if used := diskUsage(t, p); used > 1<<20 {
		t.Fatalf("sparse file of 256 MiB uses %d KiB of disk", used>>10)
	}
}

func diskUsage(t *testing.T, p string) int64 {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}
