package migrations_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/migrations"
)

// With Config.Citus, Up on a Citus coordinator applies the numbered
// migrations and then distributes idem's tables by scope, once; a second
// Up leaves them as they are; Down refuses; and a plain Up of a schema
// that another binary distributed does nothing to it.
func TestCitusUpDistributesOnceAndDownRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewCitusSchema(t)
	m, err := migrations.New(schema.Pool, &migrations.Config{Schema: schema.Name, Citus: true})
	require.NoError(t, err)
	res, err := m.Up(ctx)
	require.NoError(t, err)
	require.True(t, res.Distributed)
	require.Equal(t, migrations.Latest(), res.To)

	var tables []string
	rows, err := schema.Pool.Query(ctx, `SELECT c.relname FROM pg_dist_partition p
		JOIN pg_class c ON c.oid = p.logicalrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 ORDER BY 1`, schema.Name)
	require.NoError(t, err)
	for rows.Next() {
		var name string
		require.NoError(t, rows.Scan(&name))
		tables = append(tables, name)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"idem_keys", "idem_leases", "idem_stragglers", "idem_verdicts"}, tables)
	var colocated bool
	require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT count(DISTINCT colocationid) = 1 FROM pg_dist_partition
		WHERE logicalrelid IN ($1::regclass, $2::regclass, $3::regclass, $4::regclass)`,
		schema.Name+".idem_keys", schema.Name+".idem_leases", schema.Name+".idem_stragglers", schema.Name+".idem_verdicts").Scan(&colocated))
	require.True(t, colocated, "idem_keys, idem_leases and idem_verdicts are co-located")

	// Every shard of idem_keys keeps the table's fillfactor, which leaves
	// room for the HOT updates of phase commits.
	var shards, withFillfactor int
	require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE result = '{fillfactor=80}')
		FROM run_command_on_shards($1, $$SELECT reloptions FROM pg_class WHERE oid = '%s'::regclass$$)`,
		schema.Name+".idem_keys").Scan(&shards, &withFillfactor))
	require.Positive(t, shards)
	require.Equal(t, shards, withFillfactor)

	again, err := m.Up(ctx)
	require.NoError(t, err)
	require.False(t, again.Distributed, "distributed once")
	require.Empty(t, again.Applied)

	_, err = m.Down(ctx, migrations.Latest()-1)
	require.ErrorIs(t, err, migrations.ErrRefused)
	distributed, err := m.Distributed(ctx)
	require.NoError(t, err)
	require.True(t, distributed)

	plain, err := migrations.New(schema.Pool, &migrations.Config{Schema: schema.Name})
	require.NoError(t, err)
	res, err = plain.Up(ctx)
	require.NoError(t, err)
	require.False(t, res.Distributed)
}

// Config.Citus on plain PostgreSQL fails and leaves nothing behind: the
// numbered migrations roll back with the layout.
func TestCitusUpWithoutTheExtensionFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewSchema(t)
	m, err := migrations.New(schema.Pool, &migrations.Config{Schema: schema.Name, Citus: true})
	require.NoError(t, err)
	_, err = m.Up(ctx)
	require.ErrorIs(t, err, migrations.ErrNotCitus)
	v, err := m.Version(ctx)
	require.NoError(t, err)
	require.Zero(t, v)
	distributed, err := m.Distributed(ctx)
	require.NoError(t, err)
	require.False(t, distributed)
}

// A plain schema with keys in it, distributed afterwards: the keys are in
// the shards, and the coordinator keeps no local copy of them (which Citus
// leaves on disk unless told otherwise).
func TestCitusUpDistributesExistingKeysAndDropsTheLocalCopy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewCitusSchema(t)
	plain, err := migrations.New(schema.Pool, &migrations.Config{Schema: schema.Name})
	require.NoError(t, err)
	_, err = plain.Up(ctx)
	require.NoError(t, err)
	for i := range 20 {
		_, err := schema.Pool.Exec(ctx, `SELECT * FROM `+schema.Name+`.idem_acquire(NULL, $1, $2, 'f', 'POST', '/', '\x01', '{}', 60000000, false, '', '', '', 0, '', 0)`,
			"user:"+string(rune('a'+i)), "k")
		require.NoError(t, err)
	}
	// A new key carries its first lease on its row; keys heartbeated since
	// have a lease row too.
	_, err = schema.Pool.Exec(ctx, `INSERT INTO `+schema.Name+`.idem_leases (scope, key_id, fence) SELECT scope, id, fence FROM `+schema.Name+`.idem_keys`)
	require.NoError(t, err)
	m, err := migrations.New(schema.Pool, &migrations.Config{Schema: schema.Name, Citus: true})
	require.NoError(t, err)
	res, err := m.Up(ctx)
	require.NoError(t, err)
	require.True(t, res.Distributed)
	var keys, leases int
	require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+schema.Name+`.idem_keys), (SELECT count(*) FROM `+schema.Name+`.idem_leases)`).Scan(&keys, &leases))
	require.Equal(t, 20, keys)
	require.Equal(t, 20, leases)
	var local int64
	require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT pg_relation_size($1::regclass) + pg_relation_size($2::regclass)`,
		schema.Name+".idem_keys", schema.Name+".idem_leases").Scan(&local))
	require.Zero(t, local, "the coordinator's local copy of the distributed tables")
}
