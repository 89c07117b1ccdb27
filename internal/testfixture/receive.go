package testfixture

import (
	"testing"
	"time"
)

// Receive returns the next value from ch, failing t if none comes within limit. The limit bounds
// a wait for something that must happen, so that a broken test fails instead of hanging; it is
// never what the test waits for.
func Receive[T any](t testing.TB, ch <-chan T, limit time.Duration) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(limit):
		t.Fatalf("nothing received within %s", limit)
		panic("unreachable")
	}
}
