// Package airlock runs untrusted code — above all code written by a language
// model — inside microVMs with their own kernel, and hands back the result.
//
// A Runtime manages boxes under a home directory (AIRLOCK_HOME, default
// ~/.airlock). A Box is a QEMU microVM booted from an OCI image: the image's
// layers become a read-only erofs base shared by every box of that image,
// plus a per-box ext4 writable layer, joined by overlayfs in the guest. A
// guest agent (cmd/airlock-agent, PID 1) runs commands for the host over
// protobuf calls on yamux streams on virtio-serial (or vsock).
//
//	rt, err := airlock.Open(airlock.Options{})
//	box, err := rt.Create(ctx, airlock.BoxOptions{Image: "python:slim", AutoRemove: true})
//	defer box.Close()
//	res, err := box.Exec(ctx, "python3", []string{"-c", "print(6*7)"}, airlock.ExecOptions{Timeout: 10 * time.Second})
//	// res.ExitCode, res.Stdout, res.Stderr, res.TimedOut
//
// Errors and results: a command's non-zero exit and a timeout are results
// (ExecResult); errors mean the exec could not be carried out — the box is
// not running (ErrBoxNotRunning), its VM died (ErrBoxDied, a *DiedError with
// the cause and the console's tail), or the context was cancelled.
//
// Boxes are detached from the process that made them: another process can
// Get the same box by id or name and Exec in it. Runtime.Open reconciles
// records with reality (a box whose QEMU is gone is stopped; an AutoRemove
// box whose creator died is removed).
//
// Higher layers: package codebox (Python snippets and stateful, notebook-like
// contexts) and package interp (the model ↔ box code-interpreter loop).
package airlock
