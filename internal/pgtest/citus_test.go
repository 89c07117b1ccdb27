package pgtest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// A worker killed with SIGKILL fails the statements routed to it and no others; restarted on the
// same port it serves them again, with every row it had committed. Close leaves no process and no
// directory behind.
func TestCitusWorkerKilledAndRestarted(t *testing.T) {
	t.Parallel()
	began := time.Now()
	cluster := NewCitus(t, &CitusOptions{Logf: t.Logf})
	t.Logf("own cluster started in %s", time.Since(began).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), citusTestTimeout)
	defer cancel()

	db := connect(t, cluster.URL())
	_, err := db.Exec(ctx, "CREATE TABLE rides (scope text PRIMARY KEY, n int NOT NULL)")
	require.NoError(t, err)
	_, err = db.Exec(ctx, "SELECT create_distributed_table('rides', 'scope')")
	require.NoError(t, err)
	_, err = db.Exec(ctx, "INSERT INTO rides SELECT 'user:' || n, 0 FROM generate_series(1, 100) n")
	require.NoError(t, err)

	victim, survivor := cluster.Workers()[0], cluster.Workers()[1]
	onVictim, onSurvivor := scopeOn(ctx, t, db, victim), scopeOn(ctx, t, db, survivor)

	victimPID := postmasterPID(t, victim)
	require.True(t, victim.Alive())
	require.NoError(t, victim.Kill())
	require.False(t, victim.Alive())
	require.False(t, processAlive(victimPID), "the worker's postmaster is gone")
	_, err = pgx.Connect(ctx, victim.URL())
	require.Error(t, err, "the killed worker accepts no connections")

	// Through the coordinator, a key on the dead worker fails and a key on the live one is served.
	_, err = db.Exec(ctx, "UPDATE rides SET n = n + 1 WHERE scope = $1", onVictim)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "the coordinator reports the dead worker as an error of its own")
	t.Logf("a statement routed to the killed worker: %v", err)
	_, err = db.Exec(ctx, "UPDATE rides SET n = n + 1 WHERE scope = $1", onSurvivor)
	require.NoError(t, err, "the live worker keeps serving")

	require.NoError(t, victim.Restart(ctx))
	require.True(t, victim.Alive())
	require.Equal(t, victimPID != postmasterPID(t, victim), true, "a new postmaster")
	// The coordinator may hold a broken connection to the old process for one more statement.
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		_, err := db.Exec(ctx, "UPDATE rides SET n = n + 1 WHERE scope = $1", onVictim)
		return err == nil, nil
	})
	require.NoError(t, err, "the restarted worker serves its keys again")
	var total, onVictimN int
	require.NoError(t, db.QueryRow(ctx, "SELECT count(*) FROM rides").Scan(&total))
	require.Equal(t, 100, total, "every row the killed worker had committed is there")
	require.NoError(t, db.QueryRow(ctx, "SELECT n FROM rides WHERE scope = $1", onVictim).Scan(&onVictimN))
	require.Equal(t, 1, onVictimN, "the statement that failed while the worker was dead did nothing")

	// Close stops every node, killed-and-restarted or not, and removes its directory.
	var dirs []string
	var pids []int
	for _, node := range append(cluster.workerClusters(), cluster.coordinator) {
		dirs = append(dirs, node.workDir)
		pids = append(pids, node.cmd.Process.Pid)
	}
	require.NoError(t, cluster.Close())
	for _, dir := range dirs {
		_, err := os.Stat(dir)
		require.ErrorIs(t, err, os.ErrNotExist, "Close removes %s", dir)
	}
	require.False(t, slices.ContainsFunc(pids, processAlive), "Close stops every postmaster")
}

// scopeOn finds a scope of the rides table (user:1 to user:100) whose shard is on worker w.
func scopeOn(ctx context.Context, t *testing.T, db *pgx.Conn, w *CitusWorker) string {
	t.Helper()
	for n := 1; n <= 100; n++ {
		scope := "user:" + strconv.Itoa(n)
		var port int
		require.NoError(t, db.QueryRow(ctx, `
			SELECT nodeport FROM citus_shards
			WHERE shardid = get_shard_id_for_distribution_column('rides', $1::text)`, scope).Scan(&port))
		if port == w.Port() {
			return scope
		}
	}
	t.Fatalf("no scope of rides lives on the worker on port %d", w.Port())
	return ""
}

func postmasterPID(t *testing.T, w *CitusWorker) int {
	t.Helper()
	pid, err := readPIDFile(filepath.Join(w.cluster.dataDir, "postmaster.pid"))
	require.NoError(t, err)
	return pid
}

// CreateDatabase makes a database where Citus works at once: the extension on every node and the
// nodes registered, so a table distributes over both workers.
func TestCitusCreateDatabase(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), citusTestTimeout)
	defer cancel()
	cluster := SharedCitus(t)
	dbURL, err := cluster.CreateDatabase(ctx, "citus_db")
	require.NoError(t, err)
	require.Contains(t, dbURL, "/citus_db_")

	db := connect(t, dbURL)
	var workers int
	require.NoError(t, db.QueryRow(ctx, "SELECT count(*) FROM citus_get_active_worker_nodes()").Scan(&workers))
	require.Equal(t, 2, workers)
	_, err = db.Exec(ctx, "CREATE TABLE t (scope text PRIMARY KEY)")
	require.NoError(t, err)
	_, err = db.Exec(ctx, "SELECT create_distributed_table('t', 'scope')")
	require.NoError(t, err)
	var nodes int
	require.NoError(t, db.QueryRow(ctx, "SELECT count(DISTINCT nodeport) FROM citus_shards WHERE table_name = 't'::regclass").Scan(&nodes))
	require.Equal(t, 2, nodes, "the shards are spread over both workers")

	_, err = cluster.CreateDatabase(ctx, "Bad-Name")
	require.ErrorIs(t, err, ErrInvalidName)
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
