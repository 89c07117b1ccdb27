package idem_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/testfixture"
)

// layouts are the database layouts the core suite runs on, as River's
// riverdrivertest runs one suite per driver: plain PostgreSQL, the same
// through PgBouncer in transaction mode, and Citus (idem's tables
// distributed by scope). Each is found like the PostgreSQL binaries; one
// that is missing skips its subtests with a loud note (pgtest).
var layouts = []struct {
	name  string
	setup func(t *testing.T) *testBundle
}{
	{"plain", setup},
	{"pgbouncer", func(t *testing.T) *testBundle { return setupBounced(t, pgx.QueryExecModeCacheDescribe) }},
	{"citus", setupCitus},
}

// coreSuite is what every layout must do alike: the request's contract
// (new key, replay, mismatch, in progress), crash and takeover, the fence,
// heartbeats, two maintainers without double work, and waits.
var coreSuite = []struct {
	name string
	run  func(t *testing.T, b *testBundle)
}{
	{"new key, replay, mismatch, in progress", newKeyReplayMismatchInProgress},
	{"crash and takeover", crashLeavesKeyLockedUntilLeaseExpires},
	{"fence", fencingStopsATakenOverWorker},
	{"heartbeat", heartbeatKeepsASlowPhaseLease},
	{"maintainers", func(t *testing.T, b *testBundle) { twoMaintainersDoNoDoubleWork(t, setupSMSOn(t, b)) }},
	{"waits", waitGetsTheFirstAnswer},
}

// The core suite on every layout; it logs how many of its tests passed on
// each.
func TestCoreSuiteOnEveryLayout(t *testing.T) {
	t.Parallel()
	passed := map[string]*atomic.Int32{}
	for _, layout := range layouts {
		passed[layout.name] = &atomic.Int32{}
	}
	t.Cleanup(func() {
		for _, layout := range layouts {
			t.Logf("core suite on %s: %d of %d passed", layout.name, passed[layout.name].Load(), len(coreSuite))
		}
	})
	for _, layout := range layouts {
		t.Run(layout.name, func(t *testing.T) {
			t.Parallel()
			for _, test := range coreSuite {
				t.Run(test.name, func(t *testing.T) {
					t.Parallel()
					t.Cleanup(func() {
						if !t.Failed() && !t.Skipped() {
							passed[layout.name].Add(1)
						}
					})
					test.run(t, layout.setup(t))
				})
			}
		})
	}
}

// newKeyReplayMismatchInProgress: a new key runs every phase once; a retry
// replays it byte for byte; another body is a mismatch (422); a duplicate
// while the first runs is in progress (409).
func newKeyReplayMismatchInProgress(t *testing.T, b *testBundle) {
	ctx := context.Background()
	r := b.runner(t, nil)
	first, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, first.Kind)
	require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 1, "receipt_enqueued": 1}, b.counts.Get())
	rec := b.key(t, "k1")
	require.Equal(t, idemtype.StoredFinished, rec.Status)
	require.Equal(t, b.clock.Now().Add(24*time.Hour), rec.ExpiresAt.UTC())

	again, err := b.runner(t, nil).Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, again.Kind)
	require.Equal(t, first.Response.Body, again.Response.Body)
	require.Equal(t, 1, b.countRows(t, "rides"))
	require.Equal(t, 1, b.provider.Charges())

	mismatch, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "LA", Amount: 20}))
	require.ErrorIs(t, err, idem.ErrMismatch)
	require.Equal(t, idem.OutcomeMismatch, mismatch.Kind)

	// Hold k2 inside its first phase: a second request is in progress.
	pause := testfixture.NewPause(t)
	b.hooks["ride_created"] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		pause.Hold(context.Background())
		return nil
	}
	done := make(chan error, 1)
	go func() {
		_, err := r.Execute(ctx, b.flow, b.request("k2", rideInput{Origin: "SF", Amount: 5}))
		done <- err
	}()
	<-pause.Reached()
	busy, err := b.runner(t, nil).Execute(ctx, b.flow, b.request("k2", rideInput{Origin: "SF", Amount: 5}))
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.Equal(t, idem.OutcomeInProgress, busy.Kind)
	pause.Release()
	require.NoError(t, <-done)
}

// waitGetsTheFirstAnswer: a request that waits for the key in flight gets
// the first request's answer, replayed, and the provider is called once.
func waitGetsTheFirstAnswer(t *testing.T, tb *testBundle) {
	b := setupWaitOn(t, tb, nil)
	first := b.execute("k-1", 0)
	<-b.pause.Reached()
	waiter := b.execute("k-1", time.Minute)
	<-b.inProgress
	b.pause.Release()
	one, two := <-first, <-waiter
	require.NoError(t, one.err)
	require.NoError(t, two.err)
	require.Equal(t, idem.OutcomeReplayed, two.out.Kind)
	require.Equal(t, one.out.Response.Body, two.out.Response.Body)
	require.Positive(t, two.out.Waited)
	require.Equal(t, 1, b.provider.Charges())
}
