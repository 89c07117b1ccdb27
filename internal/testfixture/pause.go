package testfixture

import (
	"context"
	"sync"
	"testing"
)

// Pause holds the code under test at one point while the test does
// something else: a phase that must be inside its transaction, a handler
// in the middle of a request. The code calls Hold there; the first call
// signals Reached and blocks until Release (or its context ends); later
// calls, and every call after Release, pass straight through.
//
//	pause := testfixture.NewPause(t)
//	hooks["charge_created"] = func(ctx context.Context, ...) error { pause.Hold(ctx); return nil }
//	go execute()
//	<-pause.Reached()
//	... the key is held in charge_created ...
//	pause.Release()
type Pause struct {
	reached chan struct{}
	release chan struct{}
	first   sync.Once
	Release func() // lets the held call go on; safe to call more than once
}

// NewPause returns a Pause that t's cleanup releases, so that a test that
// fails while the code is held does not leave it holding a transaction and
// a connection that the schema's cleanup waits for.
func NewPause(t testing.TB) *Pause {
	p := &Pause{reached: make(chan struct{}), release: make(chan struct{})}
	p.Release = sync.OnceFunc(func() { close(p.release) })
	t.Cleanup(p.Release)
	return p
}

// Hold blocks the first caller until Release or until ctx ends, having
// signalled Reached, and returns true; any other call returns false at once.
func (p *Pause) Hold(ctx context.Context) bool {
	first := false
	p.first.Do(func() { first = true })
	if !first {
		return false
	}
	close(p.reached)
	select {
	case <-p.release:
	case <-ctx.Done():
	}
	return true
}

// Reached is closed once the first Hold is under way.
func (p *Pause) Reached() <-chan struct{} { return p.reached }
