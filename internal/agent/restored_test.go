//go:build linux

package agent_test

import (
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/agent"
	"github.com/airlock-run/airlock/internal/agent/agentpb"
)

// TestRestoredOnHostLeavesTheHostAlone: an agent running as a host process
// (the fake VM driver restores boxes too) neither adds entropy to the
// host's RNG nor steps the host's clock when told its box was restored:
// the call succeeds (as non-root both would fail with EPERM) and reports
// no step (as root a step to "now" is never exactly 0).
func TestRestoredOnHostLeavesTheHostAlone(t *testing.T) {
	s := agent.NewServer(agent.Config{Root: "/", OnHost: true})
	resp, err := s.Restored(&agentpb.RestoredRequest{Entropy: make([]byte, 32), UnixNs: time.Now().UnixNano(), Hostname: "h"})
	if err != nil {
		t.Fatalf("Restored on the host: %v", err)
	}
	if resp.StepNs != 0 {
		t.Fatalf("Restored on the host stepped the clock by %d ns", resp.StepNs)
	}
}
