package pgtest

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// citusTestTimeout bounds a Citus test once its cluster has started.
const citusTestTimeout = 5 * time.Minute

// A table distributed in a schema of the test's own has shards on both workers, and rows written
// through the coordinator land on the worker their shard is on. Two such tests run at once, each
// in its own schema, on the shared cluster.
func TestCitusSchemaDistributesATable(t *testing.T) {
	for _, name := range []string{"first", "second"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), citusTestTimeout)
			defer cancel()
			cluster := SharedCitus(t)
			require.Len(t, cluster.Workers(), 2)
			schema := NewCitusSchema(t)

			_, err := schema.Pool.Exec(ctx, "CREATE TABLE rides (scope text NOT NULL, id int NOT NULL, PRIMARY KEY (scope, id))")
			require.NoError(t, err)
			_, err = schema.Pool.Exec(ctx, "SELECT create_distributed_table('rides', 'scope')")
			require.NoError(t, err)
			_, err = schema.Pool.Exec(ctx, "INSERT INTO rides SELECT 'user:' || n, n FROM generate_series(1, 200) n")
			require.NoError(t, err)

			var rows int
			require.NoError(t, schema.Pool.QueryRow(ctx, "SELECT count(*) FROM rides").Scan(&rows))
			require.Equal(t, 200, rows)

			// Each worker holds some of the rows, in shard tables of its own, and the counts add up.
			perWorker := rowsPerWorker(ctx, t, cluster, schema.Name)
			total := 0
			for _, w := range cluster.Workers() {
				require.Positive(t, perWorker[w.Port()], "worker on port %d holds rows: %v", w.Port(), perWorker)
				total += perWorker[w.Port()]
			}
			require.Equal(t, 200, total)
		})
	}
}

// rowsPerWorker counts, on each worker directly, the rows of the rides shards it holds.
func rowsPerWorker(ctx context.Context, t *testing.T, cluster *Citus, schema string) map[int]int {
	t.Helper()
	coordinator := connect(t, cluster.URL())
	rows, err := coordinator.Query(ctx, `
		SELECT nodeport, shard_name FROM citus_shards
		WHERE table_name = ($1 || '.rides')::regclass`, schema)
	require.NoError(t, err)
	type shard struct {
		Port int
		Name string
	}
	shards, err := pgx.CollectRows(rows, pgx.RowToStructByPos[shard])
	require.NoError(t, err)
	require.NotEmpty(t, shards)

	counts := make(map[int]int)
	for _, w := range cluster.Workers() {
		worker := connect(t, w.URL())
		for _, s := range shards {
			if s.Port != w.Port() {
				continue
			}
			var n int
			require.NoError(t, worker.QueryRow(ctx, "SELECT count(*) FROM "+s.Name).Scan(&n))
			counts[w.Port()] += n
		}
	}
	return counts
}

// Where the server's library directory has no citus.so, StartCitus fails with ErrNoCitus naming
// that directory, which the helpers turn into a loud note and a skip.
func TestNoCitusIsLoud(t *testing.T) {
	binDir := t.TempDir()
	err := findCitus(binDir)
	require.ErrorIs(t, err, ErrNoCitus)
	libDir := filepath.Join(filepath.Dir(binDir), "lib")
	require.ErrorContains(t, err, "no citus.so in "+libDir)

	note := noCitusNote("TestX", err)
	require.Contains(t, note, "NOTE: Citus not installed (no citus.so in "+libDir+"): Citus tests NOT run")
	require.Contains(t, note, "TestX")

	// What this machine has: the tests above run only where citus.so is found.
	realBin, binErr := findBinDir()
	if binErr != nil {
		t.Skipf("no local PostgreSQL binaries: %v", binErr)
	}
	dirs := citusLibDirs(realBin)
	require.NotEmpty(t, dirs)
	t.Logf("the server in %s loads extensions from %s; citus.so found: %v", realBin, strings.Join(dirs, ", "), findCitus(realBin) == nil)
}

func TestCitusOptionsRejectNegativeWorkers(t *testing.T) {
	_, err := StartCitus(context.Background(), &CitusOptions{Workers: -1})
	require.Error(t, err)
	require.False(t, errors.Is(err, ErrNoCitus))
}
