package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestAgentStaysLean keeps heavy packages out of the guest agent: their
// package initialization runs at every box start (under TCG, the protobuf
// runtime's alone cost ~30 ms), and they bring code the agent has no use
// for. Tests may use them; the agent binary may not.
func TestAgentStaysLean(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	banned := []string{
		"google.golang.org/protobuf/proto",
		"google.golang.org/protobuf/reflect/",
		"google.golang.org/protobuf/internal/impl",
		"google.golang.org/grpc",
		"net/http",
		"crypto/tls",
		"encoding/json",
	}
	deps := strings.Fields(string(out))
	for _, d := range deps {
		for _, b := range banned {
			if d == strings.TrimSuffix(b, "/") || strings.HasPrefix(d, b) {
				t.Errorf("the guest agent imports %s (banned: %s)", d, b)
			}
		}
	}
	// The check must see the agent's real imports.
	if !strings.Contains(string(out), "github.com/airlock-run/airlock/internal/agent\n") {
		t.Fatalf("go list did not list the agent's packages:\n%s", out)
	}
}
