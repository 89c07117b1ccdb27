package testfixture

import (
	"maps"
	"sync"
)

// PhaseCounts counts phase body invocations by name. The zero value is ready
// to use, and it is safe for concurrent use.
type PhaseCounts struct {
	mu sync.Mutex
	n  map[string]int
}

// Add counts one run of phase.
func (c *PhaseCounts) Add(phase string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[phase]++
}

// Get returns a copy of the counts so far, by phase name; phases that never
// ran are absent.
func (c *PhaseCounts) Get() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	maps.Copy(out, c.n)
	return out
}
