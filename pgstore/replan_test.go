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
// succeeds on a fresh plan.
func TestAcquireRetriesAPlanChangedByAMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	store, _ := storeOnOneConnection(t, schema, nil)
	acquire := func(key string) (*idemdriver.AcquireResult, error) {
		return store.Acquire(ctx, idemdriver.AcquireParams{Scope: "s", Key: key, Flow: "f", Method: "POST", Path: "/",
			Fingerprints: [][]byte{[]byte{1}}, Params: []byte(`{}`), Lease: time.Minute})
	}
	res, err := acquire("before")
	require.NoError(t, err)
	require.Equal(t, idemdriver.AcquiredCreated, res.Acquired)

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
	names[21] = "r.attempts::bigint"
	args := "p_now timestamptz, p_scope text, p_key text, p_flow text, p_method text, p_path text, " +
		"p_fingerprint bytea, p_params text, p_lease bigint, p_no_create boolean, p_params_key_id text, " +
		"p_holder_instance text, p_holder_host text, p_holder_pid int, p_holder_boot text"
	_, err = schema.Pool.Exec(ctx, `ALTER FUNCTION idem_acquire(`+args+`) RENAME TO idem_acquire_before;
CREATE FUNCTION idem_acquire(`+args+`) RETURNS TABLE (`+strings.Join(cols, ", ")+`) LANGUAGE sql
AS $$ SELECT `+strings.Join(names, ", ")+` FROM idem_acquire_before($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) r $$`)
	require.NoError(t, err)

	res, err = acquire("after")
	require.NoError(t, err)
	require.Equal(t, idemdriver.AcquiredCreated, res.Acquired)
	require.Equal(t, "after", res.Record.Key)
}
