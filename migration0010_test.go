package idem_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// The release before 0010 keeps acquiring on one connection across
// migration 0010 and back: idem_acquire_v9 (what it calls, called here as it
// does) reads a running key's lease row into a variable of the lease
// table's row type, whose column 0010 adds and its down drops, and a
// session that compiled it before must not fail its next call.
func TestAcquireV9OnOneConnectionAcrossMigration0010(t *testing.T) {
	t.Parallel()
	acquireOnOneSessionAcross(t, 10, `idem_acquire_v9(NULL, 's', $1, 'f', 'POST', '/', '\x01', '\x02', '{}', 60000000, false, '', '', '', 0, '')`, nil)
}

// idem_notify_waiters_v10 notifies the schema's channel with the key's id
// only for a key a waiter marked, and only when the transaction commits.
func TestNotifyWaitersOnlyForMarkedKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	r := b.runner(t, nil)
	for _, key := range []string{"k-1", "k-2"} {
		_, err := r.Execute(ctx, b.flow, b.request(key, rideInput{Origin: "here", Amount: 1}))
		require.NoError(t, err)
	}
	listener, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	defer listener.Release()
	_, err = listener.Exec(ctx, `LISTEN "idem_finished:`+b.schema.Name+`"`)
	require.NoError(t, err)
	var id1, id2 int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT (SELECT id FROM idem_keys WHERE key = 'k-1'), (SELECT id FROM idem_keys WHERE key = 'k-2')`).Scan(&id1, &id2))
	_, err = b.pool.Exec(ctx, `UPDATE idem_leases SET waited_at = now() WHERE key_id = $1`, id2)
	require.NoError(t, err)

	notify := func(id int64, commit bool) bool {
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		var sent bool
		require.NoError(t, tx.QueryRow(ctx, `SELECT idem_notify_waiters_v10($1)`, id).Scan(&sent))
		if commit {
			require.NoError(t, tx.Commit(ctx))
		} else {
			require.NoError(t, tx.Rollback(ctx))
		}
		return sent
	}
	require.False(t, notify(id1, true), "nobody waits for k-1")
	require.True(t, notify(id2, false), "rolled back: sent nothing")
	require.True(t, notify(id2, true))
	n, err := listener.Conn().WaitForNotification(ctx)
	require.NoError(t, err)
	require.Equal(t, "idem_finished:"+b.schema.Name, n.Channel)
	require.Equal(t, fmt.Sprint(id2), n.Payload, "the key's id, not the key")
	// Nothing else came: a round trip receives what is pending, and a
	// wait that may not block finds nothing.
	require.NoError(t, listener.Ping(ctx))
	done, cancel := context.WithCancel(ctx)
	cancel()
	_, err = listener.Conn().WaitForNotification(done)
	require.ErrorIs(t, err, context.Canceled)
}
