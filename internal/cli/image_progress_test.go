package cli

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/imagetest"
)

// TestPullWithProgress checks the Runtime pull events the CLI installs: it
// says it is pulling, reports each layer and names the result.
func TestPullWithProgress(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	ref := reg.Push(t, "test/hook:v1", imagetest.Image(t, nil,
		imagetest.Tar(t, imagetest.Entry{Name: "a", Body: strings.Repeat("a", 300000)})))
	s, err := image.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	// What Runtime.Create does with Options.Pull for a missing image.
	ev := pullWithProgress(context.Background(), &out)
	ev.Start(ref)
	img, err := s.Pull(context.Background(), ref, image.PullOptions{Progress: ev.Progress})
	if err != nil {
		t.Fatal(err)
	}
	ev.Done(img.Ref, img.Digest, nil)
	if !regexp.MustCompile(`^Unable to find image '` + regexp.QuoteMeta(ref) + `' locally; pulling it\n[0-9a-f]{12}: downloaded [\d.]+ [KMG]?i?B\nPulled ` +
		regexp.QuoteMeta(img.Ref) + ` \(sha256:[0-9a-f]{12}\)\n$`).MatchString(out.String()) {
		t.Errorf("hook output:\n%s", out.String())
	}
}
