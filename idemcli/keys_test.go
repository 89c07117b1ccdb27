package idemcli

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/internal/pgtest"
)

// keys show --id finds a key by the key_id its log lines carry, without
// its scope; it excludes KEY and --scope.
func TestKeysShowByID(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewMigratedSchema(t)
	finishPayment(t, schema, "tenant:1", "k1")
	finishPayment(t, schema, "tenant:2", "k2")
	var id int64
	require.NoError(t, schema.Pool.QueryRow(context.Background(), `SELECT id FROM idem_keys WHERE key = 'k2'`).Scan(&id))

	stdout, stderr, code := runDB(t, schema, nil, "keys", "show", "--id", fmt.Sprint(id))
	t.Logf("keys show --id %d: exit %d\n%s", id, code, stdout)
	require.Equal(t, ExitOK, code, stderr)
	require.Regexp(t, `(?m)^key +k2$`, stdout)
	require.Contains(t, stdout, "tenant:2")

	_, _, code = runDB(t, schema, nil, "keys", "show", "--id", "999999")
	require.Equal(t, ExitNotFound, code)
	for _, args := range [][]string{{"keys", "show"}, {"keys", "show", "k1"}, {"keys", "show", "k1", "--scope", "tenant:1", "--id", "1"}, {"keys", "show", "--id", "-1"}} {
		_, stderr, code := runDB(t, schema, nil, args...)
		require.Equal(t, ExitUsage, code, "%v: %s", args, stderr)
	}
}

// keys list offers older keys (--before-id) only when there are some.
func TestKeysListOffersOlderOnesOnlyWhenThereAreSome(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewMigratedSchema(t)
	for i := range 3 {
		finishPayment(t, schema, "tenant:1", fmt.Sprintf("k%d", i))
	}
	stdout, stderr, code := runDB(t, schema, nil, "keys", "list", "--scope", "tenant:1")
	require.Equal(t, ExitOK, code, stderr)
	t.Logf("all on one page:\n%s", stdout)
	require.NotContains(t, stdout, "--before-id")

	stdout, stderr, code = runDB(t, schema, nil, "keys", "list", "--scope", "tenant:1", "--limit", "2")
	require.Equal(t, ExitOK, code, stderr)
	t.Logf("a page of two:\n%s", stdout)
	require.Contains(t, stdout, "older ones: --before-id")
	last := stdout[strings.LastIndex(stdout, "--before-id ")+len("--before-id "):]
	stdout, stderr, code = runDB(t, schema, nil, "keys", "list", "--scope", "tenant:1", "--limit", "2", "--before-id", strings.TrimSpace(last))
	require.Equal(t, ExitOK, code, stderr)
	require.Contains(t, stdout, "k0")
	require.NotContains(t, stdout, "--before-id", "the last page")
}
