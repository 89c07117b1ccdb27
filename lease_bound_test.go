package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemdriver"
)

// timedHeartbeats is a store that records each heartbeat's round trip.
type timedHeartbeats struct {
	idemdriver.Store
	mu    sync.Mutex
	trips []time.Duration
}

func (s *timedHeartbeats) Heartbeat(ctx context.Context, ref idemdriver.LockRef, lease time.Duration, now *time.Time) (time.Time, error) {
	start := time.Now()
	expires, err := s.Store.Heartbeat(ctx, ref, lease, now)
	s.mu.Lock()
	s.trips = append(s.trips, time.Since(start))
	s.mu.Unlock()
	return expires, err
}

// The shortest safe lease: a live worker keeps its key, and passes its
// self-fencing check before its foreign call, as long as a heartbeat lands
// within Lease minus LeaseMargin of the last renewal. Tolerating one lost
// heartbeat (one that times out after StatementTimeout), that is
// 2*HeartbeatInterval + StatementTimeout <= Lease - LeaseMargin; with the
// default HeartbeatInterval (Lease/3) and LeaseMargin (Lease/10), Lease >=
// 30/7 * StatementTimeout. Here StatementTimeout is 1s and Lease 5s, just
// above the bound, and three requests (fewer than the pool's connections) hold their keys through a phase
// that lasts more than two leases: each still trusts its lease at its
// foreign call after it, and finishes in one attempt at its first fence.
// The log gives the heartbeat round trips seen.
func TestShortestSafeLeaseKeepsSlowPhases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const statementTimeout, lease, phase, requests = time.Second, 5 * time.Second, 12 * time.Second, 3
	require.GreaterOrEqual(t, lease, statementTimeout*30/7, "the lease under test is at the bound or above it")
	store := &timedHeartbeats{Store: b.storeFor(t)}
	b.hooks["charge_created"] = func(ctx context.Context, tx idem.Tx, _ *idem.Attempt[rideInput]) error {
		_, err := tx.Exec(ctx, `SELECT pg_sleep($1)`, phase.Seconds())
		return err
	}
	r, err := idem.NewRunner(store, &idem.Config{Flows: []idem.AnyFlow{b.flow}, Lease: lease,
		StatementTimeout: statementTimeout, PhaseStatementTimeout: 2 * phase})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, requests)
	for i := range requests {
		wg.Go(func() {
			out, err := r.Execute(ctx, b.flow, b.request(fmt.Sprint("slow-", i), rideInput{Origin: "SF", Amount: 20}))
			if err == nil && out.Response.Status != http.StatusCreated {
				err = fmt.Errorf("status %d", out.Response.Status)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "request %d", i)
	}
	for i := range requests {
		rec := b.key(t, fmt.Sprint("slow-", i))
		require.Equal(t, 1, rec.Attempts, "key %d was run once", i)
		require.Equal(t, int64(1), rec.Fence, "key %d was never taken over", i)
	}
	require.Equal(t, requests, b.provider.Charges(), "every call passed the self-fencing check once")

	store.mu.Lock()
	trips := slices.Clone(store.trips)
	store.mu.Unlock()
	slices.Sort(trips)
	require.NotEmpty(t, trips)
	t.Logf("Lease %s, HeartbeatInterval %s, LeaseMargin %s, StatementTimeout %s: %d requests held their keys through a %s phase; "+
		"%d heartbeats, round trip median %s, p99 %s, max %s; bound 2*HeartbeatInterval+StatementTimeout = %s <= Lease-LeaseMargin = %s",
		lease, lease/3, lease/10, statementTimeout, requests, phase, len(trips), trips[len(trips)/2].Round(time.Microsecond),
		trips[len(trips)*99/100].Round(time.Microsecond), trips[len(trips)-1].Round(time.Microsecond),
		2*(lease/3)+statementTimeout, lease-lease/10)
}
