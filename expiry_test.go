package idem_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
)

// A finished key past its expiry is absent, whether or not the reaper has
// run: a request with it runs as a new request, never a replay of the old
// response, and a new row replaces the old one in the acquisition itself.
func TestExpiredKeyIsNotReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.runner(t, &idem.Config{Retention: time.Hour})
	req := b.request("k1", rideInput{Origin: "SF", Amount: 5})

	first, err := r.Execute(ctx, b.flow, req)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, first.Kind)
	out, err := r.Execute(ctx, b.flow, req)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind, "replayed until it expires")

	b.clock.Advance(time.Hour) // expires_at is inclusive: expired now
	out, err = r.Execute(ctx, b.flow, req)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind, "an expired key is not replayed")
	require.NotEqual(t, first.Record.ID, out.Record.ID, "a new row replaced it")
	require.NotEqual(t, first.Response.Body, out.Response.Body, "a new ride")
	require.Equal(t, 1, b.countRows(t, "idem_keys"))
	require.Equal(t, 2, b.countRows(t, "rides"))
	require.Equal(t, 1, b.countRows(t, "rides WHERE key_id IS NULL"), "the old key's business row survives, detached")
	require.Equal(t, map[string]int{"ride_created": 2, "charge_created": 2, "receipt_enqueued": 2}, b.counts.Get())

	// After expiry the key may be reused for something else altogether.
	b.clock.Advance(time.Hour)
	out, err = r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "LA", Amount: 7}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind, "not a mismatch")

	// A listing shows an expired key until it is replaced or reaped.
	b.clock.Advance(time.Hour)
	list, err := r.ListKeys(ctx, idemtype.KeyQuery{AllScopes: true, State: idemtype.KeyStateExpired})
	require.NoError(t, err)
	require.Len(t, list.Keys, 1)
}

// Acquirers racing for one expired key: exactly one replaces it and runs;
// the others see its new row (in progress, or its new response), never the
// expired one's response.
func TestConcurrentAcquirersOfAnExpiredKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg := &idem.Config{Retention: time.Hour}
	req := b.request("k1", rideInput{Origin: "SF", Amount: 5})
	first, err := b.runner(t, cfg).Execute(ctx, b.flow, req)
	require.NoError(t, err)
	b.clock.Advance(2 * time.Hour)

	const racers = 8
	// The winner's first phase waits until every loser has its answer, so
	// the losers cannot see it finished.
	losersDone := make(chan struct{})
	var entered sync.Once
	b.hooks["ride_created"] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		entered.Do(func() { <-losersDone })
		return nil
	}
	type result struct {
		out *idem.Outcome
		err error
	}
	results := make(chan result, racers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range racers {
		r := b.runner(t, cfg)
		wg.Go(func() {
			<-start
			out, err := r.Execute(ctx, b.flow, req)
			results <- result{out, err}
		})
	}
	close(start)
	var executed, inProgress int
	for i := range racers {
		res := <-results
		switch res.out.Kind {
		case idem.OutcomeExecuted:
			require.NoError(t, res.err)
			executed++
		case idem.OutcomeInProgress:
			require.ErrorIs(t, res.err, idem.ErrInProgress)
			require.NotNil(t, res.out.Record, "a duplicate sees the key its winner committed")
			require.NotEqual(t, first.Record.ID, res.out.Record.ID, "the new row, not the expired one")
			inProgress++
			if inProgress == racers-1 {
				close(losersDone)
			}
		default:
			t.Fatalf("racer %d: %s: %v", i, res.out.Kind, res.err)
		}
	}
	wg.Wait()
	require.Equal(t, 1, executed)
	require.Equal(t, racers-1, inProgress)
	require.Equal(t, 1, b.countRows(t, "idem_keys"))
	require.Equal(t, 2, b.countRows(t, "rides"))
	require.Equal(t, fmt.Sprint(map[string]int{"ride_created": 2, "charge_created": 2, "receipt_enqueued": 2}), fmt.Sprint(b.counts.Get()))
}
