package cli_test

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/creack/pty"

	"github.com/airlock-run/airlock/internal/vmtest"
	"github.com/airlock-run/airlock/interp/interptest"
)

// TestAskProgressOnTerminal: with stderr on a pseudo-terminal, ask keeps a
// status line there (booting box, waiting for the model, step N/M,
// running code) and erases it; stdout carries only the answer. (Off a
// terminal, TestAskToolMode checks that none of it is printed.)
func TestAskProgressOnTerminal(t *testing.T) {
	vmtest.Require(t)
	home := t.TempDir()
	f := interptest.NewFakeOpenAI(t, func(n int, req interptest.Request) interptest.Reply {
		if n == 0 {
			return interptest.Reply{ToolCalls: []interptest.ToolCall{callPython("c1", "print(6*7)")}}
		}
		return interptest.Reply{Content: "42"}
	})
	ptm, pts, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	defer ptm.Close()
	cmd := exec.Command(airlockBin, "ask", "--quiet", "--model", "m", "--max-steps", "3", "--network", "disabled", "what is 6*7?")
	cmd.Env = append(os.Environ(), "AIRLOCK_HOME="+home, "AIRLOCK_IMAGES="+vmtest.ImagesDir(),
		"OPENAI_API_KEY=k", "OPENAI_BASE_URL="+f.BaseURL)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, pts
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pts.Close()
	var tty bytes.Buffer
	copied := make(chan struct{})
	go func() { io.Copy(&tty, ptm); close(copied) }()
	err = cmd.Wait()
	ptm.Close()
	<-copied
	line := tty.String()
	if err != nil || out.String() != "42\n" {
		t.Fatalf("ask: %v stdout %q terminal %q", err, out.String(), line)
	}
	for _, want := range []string{"booting box", "waiting for the model (step 1/3)", "running code (step 1/3)", "waiting for the model (step 2/3)"} {
		if !strings.Contains(line, want) {
			t.Errorf("terminal lacks %q: %q", want, line)
		}
	}
	if !strings.HasSuffix(line, "\r\033[K") {
		t.Errorf("the status line was not erased at the end: %q", line[max(0, len(line)-80):])
	}
}
