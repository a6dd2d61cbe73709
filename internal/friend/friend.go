// Package friend carries the calls between package airlock and the
// module's own packages built on it (codebox) that are no part of the
// public API (the pattern of gRPC's internal package): package airlock
// sets these variables in an init function, so they are set whenever a
// caller can hold one of its values; its friends call them. The values
// are passed as any, because this package cannot import airlock.
package friend

import "context"

// PoolWarm sets warm as the warm hook of pool (an *airlock.PoolOptions):
// it runs on each box of the pool once the box is up (an *airlock.Box),
// before the box can be claimed; on error the box is removed; what it
// returns is handed to the claimer (TakeWarm). codebox.Pool starts each
// box's Python kernel with it.
var PoolWarm func(pool any, warm func(ctx context.Context, box any) (any, error))

// TakeWarm returns, once, what the warm hook (PoolWarm) made for box (an
// *airlock.Box) when Create took it from a warm pool of its runtime; nil
// otherwise, and on later calls.
var TakeWarm func(box any) any
