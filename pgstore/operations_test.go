package pgstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
)

func TestOperationsQueriesAreFullyRendered(t *testing.T) {
	t.Parallel()
	for _, prefix := range []string{"", `"Billing".`} {
		q := newQueries(prefix)
		for _, sql := range []string{q.unlockKey, q.claimIdle, q.reap} {
			require.NotContains(t, sql, "{t}")
			require.NotContains(t, sql, "{cols")
			require.NotContains(t, sql, "{a}")
			require.Contains(t, sql, prefix+"idem_keys")
		}
		// The reaper must not be able to delete unfinished keys, and the
		// sweeps must stay on the partial index of unfinished keys.
		require.Contains(t, q.reap, "status = 'finished'")
		require.Contains(t, q.claimIdle, "k.status <> 'finished'")
		require.Contains(t, q.claimIdle, "SKIP LOCKED")
		require.Contains(t, q.reap, "SKIP LOCKED")
	}
}

func TestListKeysQueryHasOnlyTheFiltersAsked(t *testing.T) {
	t.Parallel()
	q := newQueries(`"s".`)
	now := time.Now()

	sql, args, err := q.listKeys(idemdriver.ListKeysParams{KeyQuery: idemtype.KeyQuery{Limit: 5}}, nil)
	require.NoError(t, err)
	require.Equal(t, []any{(*time.Time)(nil), 5}, args)
	require.Contains(t, sql, "WHERE true")
	require.Contains(t, sql, "LIMIT $2")
	require.Contains(t, sql, `FROM "s".idem_keys k`)

	sql, args, err = q.listKeys(idemdriver.ListKeysParams{
		KeyQuery: idemtype.KeyQuery{State: idemtype.KeyStateStale, Scope: "u", Key: "k", Flow: "f", BeforeID: 9, Limit: 3},
		Now:      &now,
	}, &unfinishedWindow{swept: 7, stragglers: []int64{2}})
	require.NoError(t, err)
	require.Equal(t, []any{&now, int64(7), []int64{2}, "u", "k", "f", int64(9), 3}, args)
	for _, want := range []string{unfinishedAmong("k", 2, 3), "k.scope = $4", "k.key = $5", "k.flow = $6", "k.id < $7", "LIMIT $8", keyStateConditions[idemtype.KeyStateStale]} {
		require.Contains(t, sql, want)
	}
	require.NotContains(t, sql, "$?")

	for _, st := range idemtype.KeyStates() {
		sql, _, err := q.listKeys(idemdriver.ListKeysParams{KeyQuery: idemtype.KeyQuery{State: st, Limit: 1}}, nil)
		require.NoError(t, err, st)
		require.Contains(t, sql, keyStateConditions[st])
	}
	_, _, err = q.listKeys(idemdriver.ListKeysParams{KeyQuery: idemtype.KeyQuery{State: "asleep", Limit: 1}}, nil)
	require.ErrorIs(t, err, idem.ErrInvalidRequest)
}
