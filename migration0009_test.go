package idem_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/internal/pgtest"
)

// The release before 0009 keeps acquiring on one connection across
// migration 0009 and back: idem_acquire_v8 (what it calls, called here as it
// does) reads the key into a variable of the keys table's row type, whose
// column 0009 adds and its down drops, and a session that compiled it before
// must not fail its next call. The keys it creates have no payload
// fingerprint.
func TestAcquireV8OnOneConnectionAcrossMigration0009(t *testing.T) {
	t.Parallel()
	acquireOnOneSessionAcross(t, 9, `idem_acquire_v8(NULL, 's', $1, 'f', 'POST', '/', '\x01', '{}', 60000000, false, '', '', '', 0, '')`,
		func(ctx context.Context, conn *pgxpool.Conn, schema *pgtest.Schema) {
			var payload []byte
			require.NoError(t, conn.QueryRow(ctx, `SELECT payload_fingerprint FROM `+schema.Name+`.idem_keys WHERE key = 'at-9'`).Scan(&payload))
			require.Nil(t, payload)
		})
}
