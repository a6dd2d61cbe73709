package airlock

import "time"

// hostSlack is how long past an exec's timeout and kill grace the host
// waits for the agent to report the exit before it stops trusting the
// guest: the call then returns TimedOut on the host's own authority and the
// box is marked unhealthy. Generous, for TCG guests under load.
const hostSlack = 8 * time.Second

// Unhealthy returns why the box was declared unhealthy ("" when it was
// not): its agent failed to report the end of a timed-out exec in time.
// The mark stays until the box is stopped; a box whose agent then does not
// answer a Hello within 20 s (boxvm.ProbeTimeout) is killed (later calls
// return ErrBoxDied).
func (b *Box) Unhealthy() string { return b.vm.Unhealthy() }

// markUnhealthy records why, and checks in the background that the agent
// still answers; if it does not, the machine is killed (through the VM
// driver), and later calls return a DiedError saying so.
func (b *Box) markUnhealthy(why string) { b.vm.MarkUnhealthy(why) }
