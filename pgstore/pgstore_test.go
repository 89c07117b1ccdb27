package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"testing"

	"github.com/georgysavva/scany/v2/pgxscan"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/migrations"
)

func TestMapError(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code, Message: "m"}) }
	for name, tc := range map[string]struct {
		err  error
		want error
	}{
		"serialization":       {pg("40001"), idem.ErrSerialization},
		"deadlock":            {pg("40P01"), idem.ErrSerialization},
		"connection failure":  {pg("08006"), idem.ErrStoreUnavailable},
		"admin shutdown":      {pg("57P01"), idem.ErrStoreUnavailable},
		"too many conns":      {pg("53300"), idem.ErrStoreUnavailable},
		"read-only standby":   {pg("25006"), idem.ErrStoreUnavailable},
		"network":             {&net.OpError{Op: "dial", Err: errors.New("refused")}, idem.ErrStoreUnavailable},
		"eof":                 {fmt.Errorf("read: %w", io.ErrUnexpectedEOF), idem.ErrStoreUnavailable},
		"unique violation":    {pg("23505"), nil},
		"query canceled":      {pg("57014"), nil},
		"context canceled":    {context.Canceled, nil},
		"plain error":         {errors.New("x"), nil},
		"already unavailable": {fmt.Errorf("%w: x", idem.ErrStoreUnavailable), idem.ErrStoreUnavailable},
	} {
		got := mapError(tc.err)
		require.ErrorIs(t, got, tc.err, name) // the original stays in the chain
		if tc.want == nil {
			require.False(t, errors.Is(got, idem.ErrSerialization) || errors.Is(got, idem.ErrStoreUnavailable), name)
		} else {
			require.ErrorIs(t, got, tc.want, name)
		}
	}
	require.NoError(t, mapError(nil))
}

func TestQueriesAreFullyRendered(t *testing.T) {
	t.Parallel()
	for _, prefix := range []string{"", `"Billing".`} {
		q := newQueries(prefix)
		for _, sql := range []string{q.acquire, q.claimReconcile, q.takeOver, q.advancePhase, q.withdrawPhase, q.finishPhase, q.heartbeat, q.release,
			q.markForeign, q.clearForeignMark, q.setNeedsReconcile, q.getKey, q.unlockKey, q.claimIdle, q.reap} {
			for _, placeholder := range []string{"{t}", "{l}", "{k}", "{cols", "{leaseOf", "{lease", "{holder}", "$LEASE"} {
				require.NotContains(t, sql, placeholder)
			}
			switch sql {
			case q.acquire:
				require.Contains(t, sql, prefix+"idem_acquire(")
			case q.clearForeignMark:
			default:
				require.Contains(t, sql, prefix+"idem_keys")
			}
		}
		// The statements heartbeats and marks send write the lease row only
		// (making it from the key row's first lease when the key has none);
		// a phase's commit writes the progress row only (see queries).
		for _, sql := range []string{q.heartbeat, q.markForeign} {
			require.Regexp(t, `INSERT INTO `+regexp.QuoteMeta(prefix+"idem_leases")+`(.|\n)*ON CONFLICT \(scope, key_id\) DO UPDATE`, sql)
			require.NotContains(t, sql, "UPDATE "+prefix+"idem_keys")
			require.NotContains(t, sql, "FOR UPDATE")
			require.NotContains(t, sql, "FOR SHARE")
		}
		require.Regexp(t, `UPDATE `+regexp.QuoteMeta(prefix+"idem_leases"), q.clearForeignMark)
		require.NotContains(t, q.clearForeignMark, prefix+"idem_keys")
		for _, sql := range []string{q.advancePhase, q.finishPhase} {
			require.NotContains(t, sql, "idem_leases")
		}
		// but a resolve's commit of not happened, which no heartbeat runs
		// beside, withdraws the mark with it.
		require.Regexp(t, `UPDATE `+regexp.QuoteMeta(prefix+"idem_keys")+`(.|\n)*UPDATE `+regexp.QuoteMeta(prefix+"idem_leases"), q.withdrawPhase)
	}
}

func TestNewValidatesSchema(t *testing.T) {
	t.Parallel()
	_, err := New(nil, nil)
	require.Error(t, err)
	_, err = New(fakeDB{}, &Config{Schema: `a"b`})
	require.ErrorContains(t, err, "invalid schema")
	prefix, err := migrations.QualifiedPrefix("Billing")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(newQueries(prefix).table, `"Billing".`))
}

// fakeDB only satisfies the interface for constructor tests; no query runs.
type fakeDB struct{ DB }

// recordDest must scan recordColumns positionally into the same fields
// that scany fills by column name. A row with every column set is read both
// ways and the records compared.
func TestRecordDestMatchesRecordColumns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	_, err := schema.Pool.Exec(ctx, `
		WITH k AS (
			INSERT INTO idem_keys (scope, key, flow, method, path, fingerprint, params,
				status, recovery_point, checkpoint, fence,
				response_status, response_headers, response_body, attempts, last_error, finished_at, expires_at)
			VALUES ('s', 'k', 'f', 'PATCH', '/p', '\x0102', '{"a": 1}', 'needs_reconcile', 'first', '{"c": 2}',
				7, 402, '{"X": ["y"]}', '\x7b7d', 3, 'boom', now(), now() + interval '1 day')
			RETURNING scope, id, fence
		)
		INSERT INTO idem_leases (scope, key_id, fence, locked_at, lease_expires_at, foreign_mark, foreign_mark_after)
		SELECT scope, id, fence, now() - interval '1 minute', now() + interval '1 minute', 'phase', 'first' FROM k`)
	require.NoError(t, err)
	store, err := New(schema.Pool, &Config{Schema: schema.Name})
	require.NoError(t, err)

	var byName idemtype.KeyRecord
	require.NoError(t, pgxscan.Get(ctx, schema.Pool, &byName, store.q.getKey, "s", "k"))
	byPosition, err := store.GetKey(ctx, "s", "k")
	require.NoError(t, err)
	require.Equal(t, byName, *byPosition)
	require.Equal(t, "phase", byPosition.ForeignMark)
	require.NotNil(t, byPosition.LockedAt)
	require.NotNil(t, byPosition.LeaseExpiresAt)
	require.Equal(t, 402, byPosition.ResponseStatus)
}
