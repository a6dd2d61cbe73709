package pagediff

import (
	"bytes"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

const testSize = 64 * PageSize

// image is a test image: its bytes, written to a sparse file on save.
type image []byte

func (im image) page(i int) []byte { return im[i*PageSize : (i+1)*PageSize] }

// save stores im as snapshot dir (a delta against parent's, "" for a
// root), as a driver does, and returns the bytes stored.
func save(t *testing.T, root, dir, parent string, im image) int64 {
	t.Helper()
	d := filepath.Join(root, dir)
	if err := os.MkdirAll(d, 0o700); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "src")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Truncate(testSize)
	for i := 0; i < testSize/PageSize; i++ {
		if !isZero(im.page(i)) { // holes where zero, as a memfd
			f.WriteAt(im.page(i), int64(i)*PageSize)
		}
	}
	var ps *Sums
	if parent != "" {
		if ps, err = ReadSums(filepath.Join(root, parent, SumsName("ram")), testSize); err != nil {
			t.Fatal(err)
		}
	}
	s, n, err := Save(filepath.Join(d, "ram"), testSize, []Segment{{Src: f, Size: testSize}}, ps, NewSeed(), 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteSums(filepath.Join(d, SumsName("ram")), s); err != nil {
		t.Fatal(err)
	}
	l := Link{}
	if parent != "" {
		l = Link{Parent: parent, Deltas: []string{"ram"}}
	}
	if err := WriteLink(d, l); err != nil {
		t.Fatal(err)
	}
	return n
}

// restore materialises snapshot dir's image.
func restore(t *testing.T, root, dir string) image {
	t.Helper()
	chain, err := Chain(filepath.Join(root, dir), "ram")
	if err != nil {
		t.Fatal(err)
	}
	// Into a memfd, as a restore's RAM (copy_file_range cannot: sendfile).
	fd, err := unix.MemfdCreate("out", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "out")
	defer f.Close()
	f.Truncate(testSize)
	if _, err := Materialise(f, chain, "ram", testSize, 0, testSize); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, testSize)
	f.ReadAt(out, 0)
	return out
}

// TestChainRestoresEveryLink: a root and deltas (pages changed, pages
// zeroed, pages restored to an older content), each restored exactly;
// a delta stores only the pages that changed; removing a link in the
// middle (Merge) keeps its children restorable, also twice in a row.
func TestChainRestoresEveryLink(t *testing.T) {
	root := t.TempDir()
	rng := rand.New(rand.NewSource(1))
	a := make(image, testSize)
	for i := 0; i < 40; i++ { // pages 40.. stay zero
		rng.Read(a.page(i))
	}
	if n := save(t, root, "A", "", a); n != 40*PageSize {
		t.Fatalf("root stored %d bytes, want %d", n, 40*PageSize)
	}
	b := append(image(nil), a...)
	rng.Read(b.page(3))
	rng.Read(b.page(50))      // a zero page gets data
	copy(b.page(7), zeroPage) // a data page is zeroed
	if n := save(t, root, "B", "A", b); n != 2*PageSize {
		t.Fatalf("B stored %d bytes, want 2 pages", n)
	}
	c := append(image(nil), b...)
	copy(c.page(3), a.page(3)) // back to A's content
	rng.Read(c.page(10))
	if n := save(t, root, "C", "B", c); n != 2*PageSize {
		t.Fatalf("C stored %d bytes, want 2 pages", n)
	}
	d := append(image(nil), a...) // a branch from A
	rng.Read(d.page(0))
	save(t, root, "D", "A", d)
	for name, want := range map[string]image{"A": a, "B": b, "C": c, "D": d} {
		if got := restore(t, root, name); !bytes.Equal(got, want) {
			t.Errorf("%s restores other bytes", name)
		}
	}
	// B goes: C takes the pages it had from B.
	if err := Merge(filepath.Join(root, "B"), []string{filepath.Join(root, "C"), filepath.Join(root, "D")}, func(string, string) (int64, error) { return testSize, nil }); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Join(root, "B"))
	if l, _ := ReadLink(filepath.Join(root, "C")); l.Parent != "A" {
		t.Errorf("C's parent after B's removal: %q, want A", l.Parent)
	}
	if got := restore(t, root, "C"); !bytes.Equal(got, c) {
		t.Error("C restores other bytes once B is gone")
	}
	// Then the root goes: C and D become whole.
	if err := Merge(filepath.Join(root, "A"), []string{filepath.Join(root, "C"), filepath.Join(root, "D")}, func(string, string) (int64, error) { return testSize, nil }); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Join(root, "A"))
	for name, want := range map[string]image{"C": c, "D": d} {
		if l, _ := ReadLink(filepath.Join(root, name)); l.Parent != "" || IsDelta(filepath.Join(root, name), "ram") {
			t.Errorf("%s after the root's removal: %+v, want whole", name, l)
		}
		if got := restore(t, root, name); !bytes.Equal(got, want) {
			t.Errorf("%s restores other bytes once A is gone", name)
		}
	}
}

// TestHostileFiles: sums of another size, a link naming a path, a chain
// that loops and a gone parent are refused, not followed.
func TestHostileFiles(t *testing.T) {
	root := t.TempDir()
	a := make(image, testSize)
	rand.New(rand.NewSource(2)).Read(a)
	save(t, root, "A", "", a)
	if _, err := ReadSums(filepath.Join(root, "A", SumsName("ram")), 2*testSize); err == nil {
		t.Error("sums of another image size read")
	}
	os.MkdirAll(filepath.Join(root, "X"), 0o700)
	os.WriteFile(filepath.Join(root, "X", LinkName), []byte(`{"v":1,"parent":"../A","deltas":["ram"]}`), 0o600)
	if _, err := Chain(filepath.Join(root, "X"), "ram"); err == nil {
		t.Error("a parent path outside the siblings followed")
	}
	os.WriteFile(filepath.Join(root, "X", LinkName), []byte(`{"v":1,"parent":"X","deltas":["ram"]}`), 0o600)
	if _, err := Chain(filepath.Join(root, "X"), "ram"); err == nil {
		t.Error("a chain that loops followed")
	}
	os.WriteFile(filepath.Join(root, "X", LinkName), []byte(`{"v":1,"parent":"gone","deltas":["ram"]}`), 0o600)
	if _, err := Chain(filepath.Join(root, "X"), "ram"); err == nil {
		t.Error("a chain whose parent is gone accepted")
	}
}
