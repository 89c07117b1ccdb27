package idemtest

import (
	"sync"
	"time"
)

// Clock is an injectable clock for idem.Config.Test.Now: leases run out
// when a test says so (Advance), never by waiting. It is safe for
// concurrent use by the test and the runners it drives.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock standing at start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time; pass the method value as Config.Test.Now.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
