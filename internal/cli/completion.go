package cli

import (
	"context"
	"strings"

	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
)

// Dynamic shell completion: box names and ids, image references. Cobra's
// generated scripts (airlock completion bash|zsh|fish|powershell) call
// 'airlock __complete', which runs these.

// boxNames returns the names (or ids of unnamed boxes) of the boxes of
// this home that pass keep, and their ids as descriptions.
func boxNames(ctx context.Context, keep func(airlock.BoxInfo) bool) []string {
	r, err := airlock.Open(airlock.Options{Warn: func(string) {}})
	if err != nil {
		return nil
	}
	defer r.Close()
	boxes, err := r.List(ctx)
	if err != nil {
		return nil
	}
	var out []string
	for _, b := range boxes {
		if keep != nil && !keep(b) {
			continue
		}
		if b.Name != "" {
			out = append(out, b.Name+"\t"+b.ID+" "+string(b.State))
		} else {
			out = append(out, b.ID+"\t"+string(b.State))
		}
	}
	return out
}

// imageNames returns the local images' references, short where Docker
// shortens them (python:slim).
func imageNames() []string {
	s, err := openImages()
	if err != nil {
		return nil
	}
	imgs, _ := s.List()
	var out []string
	for _, img := range imgs {
		repo, tag := splitRef(img.Ref)
		if tag == "<none>" {
			out = append(out, img.Ref)
		} else {
			out = append(out, repo+":"+tag)
		}
	}
	return out
}

func filterPrefix(list []string, prefix string) []string {
	var out []string
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			out = append(out, s)
		}
	}
	return out
}

// completeBoxes completes every argument with box names.
func completeBoxes(keep func(airlock.BoxInfo) bool) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(cmd *cobra.Command, args []string, to string) ([]string, cobra.ShellCompDirective) {
		return filterPrefix(boxNames(cmd.Context(), keep), to), cobra.ShellCompDirectiveNoFileComp
	}
}

// completeFirstBox completes the first argument with box names, and
// nothing after it (the command inside the box is not ours to complete).
func completeFirstBox(keep func(airlock.BoxInfo) bool) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(cmd *cobra.Command, args []string, to string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveDefault
		}
		return filterPrefix(boxNames(cmd.Context(), keep), to), cobra.ShellCompDirectiveNoFileComp
	}
}

// completeImages completes every argument with image references.
func completeImages(cmd *cobra.Command, args []string, to string) ([]string, cobra.ShellCompDirective) {
	return filterPrefix(imageNames(), to), cobra.ShellCompDirectiveNoFileComp
}

// completeFirstImage completes the first argument with image references
// (run, create: IMAGE [COMMAND...]).
func completeFirstImage(cmd *cobra.Command, args []string, to string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveDefault
	}
	return completeImages(cmd, args, to)
}

func completeBoxesAndImages(cmd *cobra.Command, args []string, to string) ([]string, cobra.ShellCompDirective) {
	return filterPrefix(append(boxNames(cmd.Context(), nil), imageNames()...), to), cobra.ShellCompDirectiveNoFileComp
}

// volumeAndSnapshotNames lists the named volumes (volumes) or the
// snapshots of the default home, for completion.
func volumeAndSnapshotNames(ctx context.Context, volumes bool) []string {
	r, err := airlock.Open(airlock.Options{Warn: func(string) {}})
	if err != nil {
		return nil
	}
	defer r.Close()
	var out []string
	if volumes {
		vols, _ := r.Volumes(ctx)
		for _, v := range vols {
			out = append(out, v.Name)
		}
		return out
	}
	snaps, _ := r.Snapshots(ctx)
	for _, s := range snaps {
		out = append(out, s.Name+"\tof "+s.Box)
	}
	return out
}

func completeVolumes(cmd *cobra.Command, args []string, to string) ([]string, cobra.ShellCompDirective) {
	return filterPrefix(volumeAndSnapshotNames(cmd.Context(), true), to), cobra.ShellCompDirectiveNoFileComp
}

func completeSnapshots(cmd *cobra.Command, args []string, to string) ([]string, cobra.ShellCompDirective) {
	return filterPrefix(volumeAndSnapshotNames(cmd.Context(), false), to), cobra.ShellCompDirectiveNoFileComp
}

func running(b airlock.BoxInfo) bool    { return b.State == airlock.BoxRunning }
func notRunning(b airlock.BoxInfo) bool { return b.State != airlock.BoxRunning }

// completions attaches the completion functions to the verbs of root by
// name (verbs added by other files get theirs here too).
func completions(root *cobra.Command) {
	byName := map[string]func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective){
		"run": completeFirstImage, "create": completeFirstImage, "exec": completeFirstBox(running),
		"start": completeBoxes(notRunning), "stop": completeBoxes(running), "rm": completeBoxes(nil),
		"logs": completeFirstBox(nil), "rename": completeFirstBox(nil), "top": completeFirstBox(running),
		"stats": completeBoxes(running), "inspect": completeBoxesAndImages,
		"rmi": completeImages, "save": completeFirstImage,
		"fork": completeFirstBox(running), "pause": completeBoxes(running), "unpause": completeBoxes(running),
	}
	subs := map[string]map[string]func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective){
		"volume":   {"rm": completeVolumes},
		"snapshot": {"rm": completeSnapshots, "inspect": completeSnapshots, "create": completeFirstBox(running)},
	}
	for _, c := range root.Commands() {
		if f, ok := byName[c.Name()]; ok && c.ValidArgsFunction == nil {
			c.ValidArgsFunction = f
		}
		for _, sub := range c.Commands() {
			if f, ok := subs[c.Name()][sub.Name()]; ok && sub.ValidArgsFunction == nil {
				sub.ValidArgsFunction = f
			}
		}
		if c.Name() == "image" {
			for _, sub := range c.Commands() {
				if f, ok := map[string]func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective){
					"rm": completeImages, "save": completeFirstImage, "inspect": completeImages}[sub.Name()]; ok && sub.ValidArgsFunction == nil {
					sub.ValidArgsFunction = f
				}
			}
		}
	}
}
