package idemcli

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/internal/pgtest"
)

// A binary that does not have the application's flows does not know their
// UnfinishedRetention, so it abandons unfinished keys only when told how old;
// an application's CLI applies its flows' own.
func TestReapAbandonsWithTheFlowsItKnows(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewMigratedSchema(t)
	insert := func(key, age string) {
		_, err := schema.Pool.Exec(context.Background(), `
WITH k AS (
    INSERT INTO idem_keys (scope, key, flow, method, path, fingerprint, params, created_at, last_run_at)
    VALUES ('s', $1, 'payments.create', 'POST', '/', '\x00', '{}', now() - $2::interval, now() - $2::interval)
    RETURNING scope, id, fence
)
INSERT INTO idem_leases (scope, key_id, fence) SELECT scope, id, fence FROM k`, key, age)
		require.NoError(t, err)
	}
	insert("old-1", "8 days")
	insert("young-1", "1 day")

	stdout, stderr, code := runDB(t, schema, nil, "reap")
	require.Equal(t, ExitOK, code, stderr)
	require.Contains(t, stdout, "and 0 unfinished")

	flow := idem.MustNewFlow("payments.create", []idem.Phase[payment]{{Name: "paid",
		Do: func(context.Context, idem.Tx, *idem.Attempt[payment]) (idem.Result, error) {
			return idem.RespondJSON(201, "ok"), nil
		}}},
		&idem.FlowConfig[payment]{UnfinishedRetention: -1})
	stdout, stderr, code = runDB(t, schema, &Config{Flows: []idem.AnyFlow{flow}}, "reap")
	require.Equal(t, ExitOK, code, stderr)
	require.Contains(t, stdout, "and 0 unfinished", "the flow keeps its keys")

	stdout, stderr, code = runDB(t, schema, nil, "reap", "--unfinished-retention", "168h", "--json")
	require.Equal(t, ExitOK, code, stderr)
	require.JSONEq(t, `{"deleted": 0, "batches": 1, "unfinished": 1, "needs_reconcile": 0}`, stdout)

	_, stderr, code = runDB(t, schema, nil, "reap", "--abandon-after", "-1h")
	require.Equal(t, ExitUsage, code)
	require.Contains(t, stderr, "negative")
}
