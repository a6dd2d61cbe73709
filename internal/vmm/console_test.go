package vmm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-run/airlock/internal/guestabi"
)

func TestGuestCause(t *testing.T) {
	for _, c := range []struct{ console, want string }{
		{"[    1.2] Kernel panic - not syncing: sysrq triggered crash\r\n", "guest kernel panic (Kernel panic - not syncing: sysrq triggered crash)"},
		{"Out of memory: Killed process 7 (python3)\n", "the guest ran out of memory"},
		{guestabi.FatalPrefix + "mount /dev/vdb: no such device\n", "the guest agent failed to set up the box"},
		{"airlock-agent: ready\n", ""},
	} {
		if got := GuestCause(c.console); got != c.want {
			t.Errorf("%q: %q, want %q", c.console, got, c.want)
		}
	}
}

func TestConsoleTail(t *testing.T) {
	p := filepath.Join(t.TempDir(), "console.log")
	if ConsoleTail(p, 3) != "" {
		t.Fatal("missing file")
	}
	os.WriteFile(p, []byte(strings.Repeat("x\n", 20000)+"a\r\n\n b  \nc"), 0o600)
	if got := ConsoleTail(p, 3); got != "a\n b\nc\n" {
		t.Fatalf("got %q", got)
	}
	d := DeathFromConsole(p, "its process exited")
	if d.Cause != "its process exited" || !strings.HasSuffix(d.ConsoleTail, "c\n") {
		t.Fatalf("%+v", d)
	}
}

// TestCopyConsoleEscapesAcrossChunks: what CopyConsole writes holds no
// control byte of the log, however large.
func TestCopyConsoleEscapesAcrossChunks(t *testing.T) {
	log := strings.Repeat("ok \x1b[2J line\r\n", 10000) // > 64 KiB
	var out strings.Builder
	if err := CopyConsole(&out, strings.NewReader(log)); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsRune(out.String(), 0x1b) || strings.Count(out.String(), `\x1b[2J`) != 10000 || strings.Count(out.String(), "\n") != 10000 {
		t.Errorf("copied %d bytes: escapes %d, lines %d", out.Len(), strings.Count(out.String(), `\x1b[2J`), strings.Count(out.String(), "\n"))
	}
}
