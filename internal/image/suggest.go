package image

import (
	"errors"
	"fmt"
	"net"
	"strings"
)

// PullError is a Pull's error for an image that is neither in the store
// nor fetched from its registry (no such image, access refused, registry
// unreachable): a short message that says what to do, with the nearest
// local image when one is close enough to be what the caller meant.
// It wraps ErrNotFound, ErrUnauthorized or ErrUnreachable.
type PullError struct {
	// Ref is the reference as the caller wrote it ("pyhton:slim").
	Ref string
	// Suggestion is the nearest local image, in the short form a user
	// types ("python:slim"); empty when none is close (see Nearest).
	Suggestion string
	msg        string
	kind       error
}

func (e *PullError) Error() string { return e.msg }

// Unwrap returns ErrNotFound, ErrUnauthorized or ErrUnreachable.
func (e *PullError) Unwrap() error { return e.kind }

// ShortName is ref as a user types it: without docker.io/library/ (or
// docker.io/) and, for a tag, with it ("python:slim"); other registries'
// references are unchanged.
func ShortName(ref string) string {
	for _, p := range []string{DockerHub + "/library/", DockerHub + "/"} {
		if strings.HasPrefix(ref, p) {
			return ref[len(p):]
		}
	}
	return ref
}

// Nearest returns the store's image name nearest to ref, in short form
// (ShortName), when it is close enough to be a typo of it: at most two
// edits away (a letter inserted, removed, replaced, or two neighbours
// swapped), one for names of under six characters; a ref written without a
// tag ("pyhton") is compared by repository alone, so it finds python:slim.
// It returns "" when no name is that close, ref is not a valid reference,
// or the store cannot be read. Ties go to the name first in sort order.
func (s *Store) Nearest(ref string) string {
	norm, err := Normalize(ref)
	if err != nil {
		return ""
	}
	idx, err := s.readIndex()
	if err != nil {
		return ""
	}
	in := ShortName(norm)
	inRepo := ShortName(repoOf(norm))
	noTag := !strings.Contains(ref, "@") && !strings.Contains(ref[strings.LastIndex(ref, "/")+1:], ":")
	limit := 2
	if len(in) < 6 {
		limit = 1
	}
	best, bestD := "", limit+1
	for _, m := range idx.Manifests {
		name := m.Annotations[AnnotationRefName]
		if name == "" || name == norm {
			continue
		}
		cand := ShortName(name)
		d := editDistance(in, cand)
		if noTag {
			d = min(d, editDistance(inRepo, ShortName(repoOf(name))))
		}
		if d < bestD || (d == bestD && cand < best) {
			best, bestD = cand, d
		}
	}
	if bestD > limit {
		return ""
	}
	return best
}

// editDistance is the optimal string alignment distance of a and b (in
// bytes): insertions, deletions, substitutions and swaps of two neighbours
// count one each. Image names are short (a reference is at most a few
// hundred bytes), so the quadratic table is small.
func editDistance(a, b string) int {
	if len(a) > 512 || len(b) > 512 {
		if a == b {
			return 0
		}
		return max(len(a), len(b))
	}
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// shortNetError says in a few words why a registry could not be reached
// ("lookup index.docker.io: no such host", "dial tcp 127.0.0.1:5000:
// connect: connection refused"), instead of the whole chain of the HTTP
// client's error (the request, the resolver's address).
func shortNetError(err error) string {
	var de *net.DNSError
	if errors.As(err, &de) {
		if de.IsNotFound {
			return "lookup " + de.Name + ": no such host"
		}
		if de.IsTimeout {
			return "lookup " + de.Name + ": timed out"
		}
		return "lookup " + de.Name + ": " + de.Err
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		s := oe.Op
		if oe.Net != "" {
			s += " " + oe.Net
		}
		if oe.Addr != nil {
			s += " " + oe.Addr.String()
		}
		if oe.Err != nil {
			s += ": " + oe.Err.Error()
		}
		return s
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timed out"
	}
	s := err.Error()
	if len(s) > 160 {
		s = s[:160] + "..."
	}
	return s
}

// notFoundError builds the PullError for ref (as written) that could not
// be fetched: the nearest local image first when there is one, then why
// (reason); advice, what to do when no local image is near, only then.
func (s *Store) notFoundError(ref, reason, advice string, kind error) *PullError {
	e := &PullError{Ref: ref, Suggestion: s.Nearest(ref), kind: kind}
	if e.Suggestion != "" {
		e.msg = fmt.Sprintf("image %q: did you mean %s? (it is not a local image, and %s)", ref, e.Suggestion, reason)
	} else {
		e.msg = fmt.Sprintf("image %q is not a local image ('airlock images' lists them), and %s", ref, reason)
		if advice != "" {
			e.msg += ": " + advice
		}
	}
	return e
}
