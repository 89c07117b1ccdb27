package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/pgstore"
)

// Every query exec mode pgx offers runs the store and the runner: a new
// key, its replay and a key resumed after a failed phase, on a direct
// connection.
func TestExecModesOnDirectConnection(t *testing.T) {
	t.Parallel()
	for _, mode := range pgtest.QueryExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.store = storeOn(t, b.schema, func(cfg *pgxpool.Config) { cfg.ConnConfig.DefaultQueryExecMode = mode })
			runExecModeFlow(t, b)
		})
	}
}

// runExecModeFlow runs a key to its end, replays it, and resumes a key whose
// second phase failed once.
func runExecModeFlow(t *testing.T, b *testBundle) {
	t.Helper()
	ctx := context.Background()
	r := b.runner(t, nil)

	out, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "Paris", Amount: 10}))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, out.Response.Status)

	again, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "Paris", Amount: 10}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, again.Kind)
	require.Equal(t, out.Response.Body, again.Response.Body)
	require.Equal(t, out.Response.Header.Get("X-Ride"), again.Response.Header.Get("X-Ride"))

	failed := false
	b.hooks["charge_created"] = func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) error {
		if !failed {
			failed = true
			return errPhaseOnce
		}
		return nil
	}
	_, err = r.Execute(ctx, b.flow, b.request("k2", rideInput{Origin: "Lyon", Amount: 5}))
	require.ErrorIs(t, err, errPhaseOnce)
	out, err = r.Execute(ctx, b.flow, b.request("k2", rideInput{Origin: "Lyon", Amount: 5}))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, out.Response.Status)
	require.Equal(t, 2, b.countRows(t, "rides"))
	require.Equal(t, 2, b.countRows(t, "jobs"))
	require.Equal(t, 2, b.provider.Calls())
}

var errPhaseOnce = errors.New("the phase fails once")

// The same, through PgBouncer in transaction pooling mode. The default
// mode (cache_statement) needs a pooler that keeps prepared statements,
// which Debian's 1.18 does not, and describe_exec needs its two messages to
// reach one server connection: pgstore.New refuses both there (see
// TestStoreRefusesCachedStatementsBehindPgBouncer).
func TestExecModesThroughPgBouncer(t *testing.T) {
	t.Parallel()
	for _, mode := range pgtest.QueryExecModes {
		if mode == pgx.QueryExecModeCacheStatement || mode == pgx.QueryExecModeDescribeExec {
			continue
		}
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			bounced := pgtest.NewBouncedSchema(t)
			b := setupOn(t, bounced.Schema)
			b.store = bouncedStore(t, bounced, mode)
			runExecModeFlow(t, b)

			other := pgtest.NewBouncedSchema(t)
			storm := setupOn(t, other.Schema)
			storm.store = bouncedStore(t, other, mode)
			runStorm(t, storm, 40)
		})
	}
}

// bouncedStore is a store through the bouncer in mode.
func bouncedStore(t *testing.T, bounced *pgtest.BouncedSchema, mode pgx.QueryExecMode) *pgstore.Store {
	t.Helper()
	return storeAt(t, bounced.BouncedURL, bounced.Name, func(cfg *pgxpool.Config) { cfg.ConnConfig.DefaultQueryExecMode = mode })
}

// runStorm sends n keys, each twice at once, then replays each: every key
// executes exactly once, and the pooler's server connections are shared
// between clients as they are in production.
func runStorm(t *testing.T, b *testBundle, n int) {
	t.Helper()
	ctx := context.Background()
	r := b.runner(t, nil)
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range n {
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := r.Execute(ctx, b.flow, b.request(fmt.Sprintf("storm-%d", i), rideInput{Origin: "Nice", Amount: 1}))
				if err != nil && !errors.Is(err, idem.ErrInProgress) {
					errs <- err
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for i := range n {
		out, err := r.Execute(ctx, b.flow, b.request(fmt.Sprintf("storm-%d", i), rideInput{Origin: "Nice", Amount: 1}))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, out.Response.Status)
	}
	require.Equal(t, n, b.countRows(t, "rides"))
	require.Equal(t, n, b.provider.Calls())
}
