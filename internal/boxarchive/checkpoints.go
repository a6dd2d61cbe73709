package boxarchive

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/airlock-run/airlock/internal/checkpoint"
	"github.com/airlock-run/airlock/internal/scratch"
)

// WholeCheckpoints writes each checkpoint of tree t whole
// (checkpoint.Tree.Flatten) into a new directory in tmpRoot, parents
// first, sealed for another host by seal when it is set
// (vmm.SnapshotSealer), for an export with checkpoints: the checkpoints,
// the box's current one, and what removes the directory. The caller
// holds the box's lock (no checkpoint taken or removed meanwhile).
func WholeCheckpoints(ctx context.Context, t checkpoint.Tree, tmpRoot string, seal func(ctx context.Context, dir string) error) ([]CheckpointSource, string, func(), error) {
	list, err := t.List()
	if err != nil {
		return nil, "", nil, err
	}
	tmp, err := scratch.MkdirTemp(tmpRoot, "export-checkpoints")
	if err != nil {
		return nil, "", nil, err
	}
	drop := func() { os.RemoveAll(tmp) }
	var out []CheckpointSource
	for _, m := range treeOrder(list) {
		dir := filepath.Join(tmp, m.Name)
		if err := os.Mkdir(dir, 0o700); err == nil {
			err = t.Flatten(m.Name, dir)
		}
		if err == nil && seal != nil {
			err = seal(ctx, dir)
		}
		if err != nil {
			drop()
			return nil, "", nil, fmt.Errorf("checkpoint %s: %w", m.Name, err)
		}
		out = append(out, CheckpointSource{Dir: dir, Checkpoint: Checkpoint{Name: m.Name,
			Parent: m.Parent, Created: m.Created, PausedNs: m.PausedNs, AgentVersion: m.AgentVersion}})
	}
	return out, t.Head(), drop, nil
}

// treeOrder returns list (oldest first) with each checkpoint after its
// parent; one whose parent is not in list (or in a loop of damaged
// records) becomes a root.
func treeOrder(list []checkpoint.Meta) []checkpoint.Meta {
	done := make(map[string]bool, len(list))
	out := make([]checkpoint.Meta, 0, len(list))
	for len(out) < len(list) {
		n := len(out)
		for _, m := range list {
			if !done[m.Name] && (m.Parent == "" || done[m.Parent]) {
				done[m.Name] = true
				out = append(out, m)
			}
		}
		if len(out) == n { // the rest have no parent among them
			for _, m := range list {
				if !done[m.Name] {
					m.Parent = ""
					done[m.Name] = true
					out = append(out, m)
					break
				}
			}
		}
	}
	return out
}

// AdoptCheckpoints gives the box in boxDir the checkpoints of archive m
// that Extract wrote under dir (CheckpointDir), parents first (the
// archive lists them so; Read checked the tree), and its current
// checkpoint.
func AdoptCheckpoints(boxDir, dir string, m *Manifest) error {
	if len(m.Checkpoints) == 0 {
		return nil
	}
	t := checkpoint.Of(boxDir)
	for i, c := range m.Checkpoints {
		src := CheckpointDir(dir, i)
		state, disk := SnapshotBytes(src)
		cm := checkpoint.Meta{Name: c.Name, Parent: c.Parent, Created: c.Created, PausedNs: c.PausedNs, AgentVersion: c.AgentVersion}
		if err := t.Adopt(cm, src, state, disk); err != nil {
			return fmt.Errorf("the archive's checkpoint %s: %w", c.Name, err)
		}
	}
	return t.SetHead(m.CheckpointHead)
}
