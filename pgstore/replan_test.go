package pgstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/internal/pgtest"
)

// A migration that changes what a statement returns invalidates the plan a
// connection prepared for it: the next execution fails with 0A000 ("cached
// plan must not change result type"), and pgx forgets the statement. The
// acquisition, which has done nothing when it fails so, runs once more and
// succeeds on a fresh plan: the plain-SQL statement a new key takes, and
// idem_acquire, which an expired key takes.
func TestAcquireRetriesAPlanChangedByAMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	acquirer := func(t *testing.T, store *Store) func(key string) *idemdriver.AcquireResult {
		return func(key string) *idemdriver.AcquireResult {
			res, err := store.Acquire(ctx, idemdriver.AcquireParams{Scope: "s", Key: key, Flow: "f", Method: "POST", Path: "/",
				Fingerprints: [][]byte{[]byte{1}}, Params: []byte(`{}`), Lease: time.Minute})
			require.NoError(t, err)
			require.Equal(t, idemdriver.AcquiredCreated, res.Acquired)
			require.Equal(t, key, res.Record.Key)
			return res
		}
	}

	t.Run("insertOrReport", func(t *testing.T) {
		t.Parallel()
		schema := pgtest.NewMigratedSchema(t)
		store, _ := storeOnOneConnection(t, schema, nil)
		acquire := acquirer(t, store)
		acquire("before")
		// A later migration widens a column the statement returns.
		_, err := schema.Pool.Exec(ctx, `ALTER TABLE idem_keys ALTER COLUMN attempts TYPE bigint`)
		require.NoError(t, err)
		acquire("after")
	})

	t.Run("idem_acquire", func(t *testing.T) {
		t.Parallel()
		schema := pgtest.NewMigratedSchema(t)
		store, _ := storeOnOneConnection(t, schema, nil)
		acquire := acquirer(t, store)
		expire := func(key string) {
			_, err := schema.Pool.Exec(ctx, `
				INSERT INTO idem_keys (scope, key, flow, method, path, fingerprint, params,
					status, recovery_point, response_status, finished_at, expires_at)
				VALUES ('s', $1, 'f', 'POST', '/', '\x01', '{}', 'finished', 'finished', 201, now() - interval '2 days', now() - interval '1 day')`, key)
			require.NoError(t, err)
		}
		expire("before")
		acquire("before")

		// The function as a later migration might make it: one column of
		// another (compatible) type, which the prepared statement's plan does
		// not expect.
		cols := []string{"acquired text", "db_now timestamptz", "id bigint",
			"scope text", "key text", "flow text", "method text", "path text", "fingerprint bytea", "params jsonb", "status text",
			"recovery_point text", "checkpoint jsonb", "foreign_mark text", "locked_at timestamptz", "lease_expires_at timestamptz",
			"fence bigint", "response_status int", "response_headers jsonb", "response_body bytea", "attempts bigint",
			"last_error text", "created_at timestamptz", "last_run_at timestamptz", "finished_at timestamptz",
			"expires_at timestamptz", "params_key_id text", "response_key_id text", "generation int",
			"holder_instance text", "holder_host text", "holder_pid int", "holder_boot text"}
		var names []string
		for _, c := range cols {
			name, _, _ := strings.Cut(c, " ")
			names = append(names, "r."+name)
		}
		names[20] = "r.attempts::bigint"
		args := "p_now timestamptz, p_scope text, p_key text, p_flow text, p_method text, p_path text, " +
			"p_fingerprint bytea, p_params text, p_lease bigint, p_no_create boolean, p_params_key_id text, " +
			"p_holder_instance text, p_holder_host text, p_holder_pid int, p_holder_boot text, p_retention bigint"
		_, err := schema.Pool.Exec(ctx, `ALTER FUNCTION idem_acquire(`+args+`) RENAME TO idem_acquire_before;
CREATE FUNCTION idem_acquire(`+args+`) RETURNS TABLE (`+strings.Join(cols, ", ")+`) LANGUAGE sql
AS $$ SELECT `+strings.Join(names, ", ")+` FROM idem_acquire_before($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) r $$`)
		require.NoError(t, err)

		expire("after")
		res := acquire("after")
		require.Equal(t, 1, res.Record.Generation, "idem_acquire replaced the expired key")
	})
}
