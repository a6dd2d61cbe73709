package airlock

import (
	"time"

	"github.com/airlock-run/airlock/internal/lifetime"
)

// What the record tests ask of a box's lifetime (internal/lifetime).

func (c *boxConfig) idleDeadline() time.Time {
	return lifetime.IdleDeadline(c.Options.IdleTimeout, c.LastUse)
}

func (c *boxConfig) hasLife() bool {
	l, _ := c.life()
	return l.Any()
}

func (c *boxConfig) reapReason(now, lastUse time.Time) ReapReason {
	l, d := c.life()
	return ReapReason(lifetime.Reason(l, d, now, lastUse))
}
