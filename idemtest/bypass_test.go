package idemtest_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
)

// A fake provider that keeps its state in the same database writes through
// a connection of its own during the foreign call: that is the provider's
// effect, not a bypass, and the check leaves it alone. An update through
// the pool after the call is a bypass, and is caught.
func TestBypassCheckSkipsTheForeignCallAndCatchesUpdates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `CREATE TABLE provider_charges (key text PRIMARY KEY);
		CREATE TABLE counters (name text PRIMARY KEY, n int NOT NULL);
		INSERT INTO counters VALUES ('orders', 0)`)
	require.NoError(t, err)

	flow := func(name string, bypass bool) *idem.Flow[orderInput] {
		return idem.MustNewFlow(name, []idem.Phase[orderInput]{{
			Name: "charged",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[orderInput]) (idem.Result, error) {
				err := run.Foreign(ctx, "charge", func(ctx context.Context, key string) error {
					_, err := b.pool.Exec(ctx, `INSERT INTO provider_charges VALUES ($1) ON CONFLICT DO NOTHING`, key)
					return err
				})
				if err != nil {
					return idem.Result{}, err
				}
				var db idem.Tx = tx
				if bypass {
					db = b.pool // the bug
				}
				if _, err := db.Exec(ctx, `UPDATE counters SET n = n + 1 WHERE name = 'orders'`); err != nil {
					return idem.Result{}, err
				}
				return idem.RespondJSON(http.StatusCreated, map[string]string{"status": "charged"}), nil
			},
		}}, nil)
	}

	rep, err := idemtest.ExploreContext(ctx, idemtest.Config[orderInput]{Pool: b.pool, Flow: flow("charge.right", false), Input: orderInput{Item: "book"}})
	require.NoError(t, err)
	require.NoError(t, rep.Err())

	rep, err = idemtest.ExploreContext(ctx, idemtest.Config[orderInput]{Pool: b.pool, Flow: flow("charge.bypass", true), Input: orderInput{Item: "book"}})
	require.NoError(t, err)
	t.Log(rep.Summary())
	require.Equal(t, []string{"crash_before_commit@charged"}, failedNames(rep))
	require.Contains(t, rep.Err().Error(), `phase "charged" wrote 1 row(s) to `+b.schema+`.counters through a connection other than its transaction`)
	require.NotContains(t, rep.Err().Error(), "provider_charges")
}

// A table named in Tables or Ignore that does not exist is a failed check,
// not a silent pass.
func TestBypassCheckRefusesAnUnknownTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config(b.orderFlow("orders.create", nil))
	cfg.Kinds = []idemtest.Kind{idemtest.CrashBeforeCommit}
	cfg.Bypass.Tables = []string{"no_such_table"}
	rep, err := idemtest.ExploreContext(context.Background(), cfg)
	require.NoError(t, err)
	require.Error(t, rep.Err())
	require.Contains(t, rep.Err().Error(), `could not check for writes that bypass the phase's transaction`)
	require.Contains(t, rep.Err().Error(), `table "no_such_table"`)
}
