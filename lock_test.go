package idem_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
)

// The heartbeat runs on a context of its own: when the caller's context ends
// while a phase carries on (a call that ignores cancellation, a commit in
// flight), the lease is still renewed until the runner lets go of the key,
// so no other worker takes the key over and runs the phase again.
func TestHeartbeatOutlivesTheCallersContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	beats := make(chan struct{}, 64)
	r := b.runner(t, &idem.Config{
		HeartbeatInterval: 5 * time.Millisecond,
		Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) {
			if e.Kind == idem.EventHeartbeat {
				select {
				case beats <- struct{}{}:
				default:
				}
			}
		}),
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	afterCancel := 0
	b.hooks["charge_created"] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		cancel()
		// Drain the beats sent before the cancellation, then wait for three
		// sent after it.
		for len(beats) > 0 {
			<-beats
		}
		deadline := time.After(30 * time.Second)
		for afterCancel < 3 {
			select {
			case <-beats:
				afterCancel++
			case <-deadline:
				return nil
			}
		}
		return nil
	}
	_, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	t.Logf("heartbeats after the caller's context ended: %d; outcome err: %v", afterCancel, err)
	require.GreaterOrEqual(t, afterCancel, 3, "the heartbeat stopped with the caller's context")
}
