// Package lifecycle is the engine of a box's life on the host: the
// sequences that start, stop and remove a box's machine and save its
// state, over its stored record (internal/store), the VM driver
// (internal/vmm), its boot's session (internal/boxvm) and its network
// helper (internal/netstack/helper); and, per runtime, the published
// ports held for suspended boxes (Ports) and the resumes in progress
// (Wakes).
//
// It knows no public type: what a box is (its options, the machine spec
// and disks they give), the public errors and the events come in from
// the root package, whose Box is the facade over it. Tested with fake
// machines, no VM.
package lifecycle
