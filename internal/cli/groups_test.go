package cli

import "testing"

// Every verb of airlock --help is in a group: none is left under cobra's
// "Additional Commands".
func TestEveryVerbGrouped(t *testing.T) {
	root := NewRoot(Streams{})
	for _, c := range root.Commands() {
		if c.GroupID == "" && c.IsAvailableCommand() {
			t.Errorf("verb %q is in no group of internal/cli/groups.go", c.Name())
		}
	}
}
