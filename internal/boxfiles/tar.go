package boxfiles

import (
	"archive/tar"
	"fmt"
	"io"
	"path"
	"strings"
)

// target is where a copy lands, by `docker cp` rules: the source's top
// entry is extracted into dir, renamed to name ("" keeps it, "." puts a
// directory's contents into dir).
type target struct{ dir, name string }

// cpTarget applies `docker cp`'s rules: src is a directory or not, and
// ends in "/." (contents only); dst exists or not, is a directory or not,
// ends in "/".
func cpTarget(src string, srcIsDir bool, dst string, dstExists, dstIsDir bool) (target, error) {
	contents := strings.HasSuffix(src, "/.")
	dstSlash := strings.HasSuffix(dst, "/") || strings.HasSuffix(dst, "/.")
	if (contents || strings.HasSuffix(src, "/")) && !srcIsDir {
		return target{}, fmt.Errorf("%s: not a directory", src)
	}
	clean := path.Clean(dst)
	switch {
	case !dstExists:
		if dstSlash && !srcIsDir {
			return target{}, fmt.Errorf("%s: destination directory does not exist", dst)
		}
		return target{dir: path.Dir(clean), name: path.Base(clean)}, nil
	case dstIsDir:
		if contents {
			return target{dir: clean, name: "."}, nil
		}
		return target{dir: clean}, nil
	default:
		if srcIsDir {
			return target{}, fmt.Errorf("cannot copy directory %s to %s: it is a file", src, dst)
		}
		if dstSlash {
			return target{}, fmt.Errorf("%s: not a directory", dst)
		}
		return target{dir: path.Dir(clean), name: path.Base(clean)}, nil
	}
}

// topName is the name of the top entry of a copy of boxPath from a box:
// its base name, "." for the root directory.
func topName(boxPath string) string {
	n := path.Base(path.Clean("/" + boxPath))
	if n == "/" {
		return "."
	}
	return n
}

// checkedTar copies the tar stream src to w, entry by entry, refusing any
// entry that is not top or under top/ (top "." accepts every relative
// name), any hard link to such an entry, and any entry under a symlink
// the archive made earlier (a reader that extracts it would write through
// the link). What follows the archive's end (the box's result) is read to
// its end.
func checkedTar(w io.Writer, src io.Reader, top string) error {
	tr := tar.NewReader(src)
	tw := tar.NewWriter(w)
	links := map[string]bool{} // cleaned names of the symlinks so far
	underLink := func(n string) string {
		c := path.Clean(n)
		for d := path.Dir(c); d != "." && d != "/"; d = path.Dir(d) {
			if links[d] {
				return d
			}
		}
		return ""
	}
	inside := func(n string) bool {
		if n == "" || strings.HasPrefix(n, "/") {
			return false
		}
		for _, c := range strings.Split(n, "/") {
			if c == ".." {
				return false
			}
		}
		c := path.Clean(n)
		return top == "." || c == top || strings.HasPrefix(c, top+"/")
	}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("reading the box's archive: %w", err)
		}
		if !inside(h.Name) {
			return fmt.Errorf("entry %q is outside %q: refused", h.Name, top)
		}
		if h.Typeflag == tar.TypeLink && !inside(h.Linkname) {
			return fmt.Errorf("hard link %q to %q, outside %q: refused", h.Name, h.Linkname, top)
		}
		if l := underLink(h.Name); l != "" {
			return fmt.Errorf("entry %q is under the symlink %q: refused", h.Name, l)
		}
		if h.Typeflag == tar.TypeSymlink {
			links[path.Clean(h.Name)] = true
		} else {
			delete(links, path.Clean(h.Name))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	_, err := io.Copy(io.Discard, src)
	return err
}
