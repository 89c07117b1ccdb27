package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/internal/pgtest"
)

// A phase statement that outlasts PhaseStatementTimeout is ended by the
// server's statement_timeout (57014 "due to statement timeout"), which
// arrives before the client's own deadline: no dropped connection and no
// cancel request (whose 57014 would say "due to user request"), which
// PgBouncer 1.18 has been seen to exit on. The phase fails as the store
// not answering in time, as documented, and the retry finishes the key.
// The statement is the phase's first (sent with BEGIN) or a later one.
func TestPhaseStatementTimeoutIsTheServers(t *testing.T) {
	t.Parallel()
	run := func(t *testing.T, b *testBundle, first bool) {
		ctx := context.Background()
		r := b.runner(t, &idem.Config{PhaseStatementTimeout: 300 * time.Millisecond})
		slow := true
		b.hooks["charge_created"] = func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) error {
			if !slow {
				return nil
			}
			slow = false
			if !first {
				if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, `SELECT pg_sleep(30)`)
			return err
		}
		out, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "Oslo", Amount: 3}))
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, "the server's timeout, not the client's deadline: %v", err)
		require.Equal(t, "57014", pgErr.Code)
		require.Contains(t, pgErr.Message, "statement timeout")
		require.ErrorIs(t, err, idem.ErrStoreUnavailable)
		require.Equal(t, idem.OutcomeStoreUnavailable, out.Kind)
		t.Logf("the slow phase failed with: %v", err)

		out, err = r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "Oslo", Amount: 3}))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, out.Response.Status)
	}
	for _, first := range []bool{true, false} {
		name := "later statement"
		if first {
			name = "first statement"
		}
		t.Run("direct/"+name, func(t *testing.T) {
			t.Parallel()
			run(t, setup(t), first)
		})
		t.Run("pgbouncer/"+name, func(t *testing.T) {
			t.Parallel()
			b := setupBounced(t, pgx.QueryExecModeCacheDescribe)
			run(t, b, first)
		})
	}
}

// A phase's own statement that pgx cannot encode fails the phase: it is
// never reported as the store being unavailable (a 503), whether it is the
// phase's first statement or a later one, in any exec mode.
func TestPhaseEncodeErrorIsNotStoreUnavailable(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		for _, first := range []bool{true, false} {
			name := mode.String() + "/later statement"
			if first {
				name = mode.String() + "/first statement"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				b.store = storeOn(t, b.schema, func(cfg *pgxpool.Config) { cfg.ConnConfig.DefaultQueryExecMode = mode })
				r := b.runner(t, nil)
				b.hooks["charge_created"] = func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) error {
					if !first {
						if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
							return err
						}
					}
					_, err := tx.Exec(ctx, `SELECT $1::int`, make(chan int))
					return err
				}
				out, err := r.Execute(context.Background(), b.flow, b.request("k1", rideInput{Origin: "Rome", Amount: 2}))
				require.Error(t, err)
				require.False(t, errors.Is(err, idem.ErrStoreUnavailable), "%v", err)
				require.Equal(t, idem.OutcomeFailed, out.Kind, "%v", err)
			})
		}
	}
}

// Behind a transaction pooler the phase statement timeout is the
// transaction's own, every time: the store sets it once per session only
// on a connection that talks to its backend directly. Here every server
// connection of the pooler's pool has been given another session timeout
// (0, none) by other clients after the runner's phases ran on them: a
// timeout remembered per client connection would let the slow statement
// run on (until the client's own deadline cut the connection, without the
// server's 57014).
func TestPhaseStatementTimeoutThroughAPoolerWhoseSessionsMix(t *testing.T) {
	t.Parallel()
	bounced := pgtest.NewBouncedSchema(t)
	b := setupOn(t, bounced.Schema)
	b.store = bouncedStore(t, bounced, pgx.QueryExecModeCacheDescribe)
	ctx := context.Background()
	r := b.runner(t, &idem.Config{PhaseStatementTimeout: 300 * time.Millisecond})
	for i := range 3 {
		_, err := r.Execute(ctx, b.flow, b.request(fmt.Sprintf("warm-%d", i), rideInput{Origin: "Oslo", Amount: 3}))
		require.NoError(t, err)
	}

	// Every server connection of the alias's pool, held at once by a
	// transaction of another client, gets statement_timeout 0 for its
	// session.
	var others []*pgx.Conn
	for range pgtest.BouncerPoolSize {
		conn, err := pgx.Connect(ctx, bounced.BouncedURL)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		_, err = conn.Exec(ctx, `BEGIN; SET statement_timeout = 0`)
		require.NoError(t, err)
		others = append(others, conn)
	}
	for _, conn := range others {
		_, err := conn.Exec(ctx, `COMMIT`)
		require.NoError(t, err)
	}

	b.hooks["charge_created"] = func(ctx context.Context, tx idem.Tx, _ *idem.Attempt[rideInput]) error {
		_, err := tx.Exec(ctx, `SELECT pg_sleep(30)`)
		return err
	}
	_, err := r.Execute(ctx, b.flow, b.request("slow", rideInput{Origin: "Oslo", Amount: 3}))
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "the server's timeout, not the client's deadline: %v", err)
	require.Equal(t, "57014", pgErr.Code)
	require.Contains(t, pgErr.Message, "statement timeout")
	require.ErrorIs(t, err, idem.ErrStoreUnavailable)
}
