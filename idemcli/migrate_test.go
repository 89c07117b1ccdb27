package idemcli

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/migrations"
)

// Reverting version 1 drops idem_keys and every key in it, so going below
// version 1 needs --yes, whether it is asked for with --to 0 or is just the
// next step down.
func TestMigrateDownBelowVersionOneNeedsYes(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewMigratedSchema(t)

	_, stderr, code := runDB(t, schema, nil, "migrate", "down", "--to", "0")
	require.Equal(t, ExitUsage, code, stderr)
	require.Contains(t, stderr, "--yes")
	require.True(t, tableExists(t, schema), "nothing was reverted")
	m, err := migrations.New(schema.Pool, &migrations.Config{Schema: schema.Name})
	require.NoError(t, err)
	v, err := m.Version(t.Context())
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v)

	// One step at a time down to version 1 needs nothing more.
	for v := migrations.Latest(); v > 1; v-- {
		_, stderr, code := runDB(t, schema, nil, "migrate", "down")
		require.Equal(t, ExitOK, code, stderr)
	}
	stdout, stderr, code := runDB(t, schema, nil, "migrate", "down")
	require.Equal(t, ExitUsage, code, stderr)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "drops idem_keys")
	require.True(t, tableExists(t, schema), "the keys table is still there")

	stdout, stderr, code = runDB(t, schema, nil, "migrate", "down", "--yes")
	require.Equal(t, ExitOK, code, stderr)
	require.Equal(t, "reverted 0001: the schema went from version 1 to 0\n", stdout)
	require.False(t, tableExists(t, schema))
}

// migrate up --citus distributes idem's tables on a Citus coordinator (the
// schema through the URL's search_path), once; migrate down refuses there.
func TestMigrateUpCitus(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewCitusSchema(t)
	stdout, stderr, code := runDB(t, schema, nil, "migrate", "up", "--citus")
	require.Equal(t, ExitOK, code, stderr)
	require.Contains(t, stdout, "idem's tables are now distributed by scope (Citus)")
	stdout, stderr, code = runDB(t, schema, nil, "migrate", "up", "--citus")
	require.Equal(t, ExitOK, code, stderr)
	require.NotContains(t, stdout, "distributed")

	_, stderr, code = runDB(t, schema, nil, "migrate", "down")
	require.NotEqual(t, ExitOK, code)
	require.Contains(t, stderr, "distributed by Citus")
	require.True(t, tableExists(t, schema))

	_, stderr, code = runDB(t, schema, nil, "keys", "list", "--all-scopes")
	require.Equal(t, ExitOK, code, stderr)
}
