package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNoCitus is wrapped by the error of [StartCitus] when this machine cannot run a Citus cluster:
// no citus.so in the PostgreSQL server's library directory, or no local PostgreSQL binaries at all.
var ErrNoCitus = errors.New("pgtest: Citus is not installed")

const (
	// citusStartTimeout bounds NewCitus's and SharedCitus's start.
	citusStartTimeout = 5 * time.Minute
	// defaultCitusWorkers is how many workers a cluster has unless CitusOptions says otherwise:
	// two, so that keys spread over more than one node.
	defaultCitusWorkers = 2
)

// citusSettings are what every node of a Citus cluster needs on top of serverSettings. Three
// servers share the machine, so each gets fewer buffers than a cluster of its own; connections
// stay many, the coordinator holding some to each worker for every session it serves. Citus sets
// max_prepared_transactions (for its two-phase commits) itself when it is 0.
//
// synchronous_commit is on, as on a pair, because serverSettings turn it off: a test that kills a
// worker must find, once it is restarted, every commit the worker had acknowledged, or it would
// see work lost that no production server would lose. (fsync stays off: the machine does not
// crash, only the process.)
var citusSettings = []string{
	"shared_preload_libraries=citus",
	"synchronous_commit=on",
	"shared_buffers=64MB",
	"max_connections=300",
}

// CitusOptions configure [StartCitus] and [NewCitus]. The zero value (or nil) is ready to use: a
// coordinator and two workers.
type CitusOptions struct {
	// Workers is the number of worker nodes. Default 2.
	Workers int

	// TempDir is where the nodes and the cached template live. Default os.TempDir(). When running
	// as root it must be reachable by the postgres user.
	TempDir string

	// Logf receives progress messages. Nil discards them.
	Logf func(format string, args ...any)

	// Settings are extra server settings ("name=value") for every node, applied last.
	Settings []string
}

// Citus is a Citus cluster made from the local PostgreSQL binaries and the citus extension
// installed into them: a coordinator and workers, each a throwaway cluster like a local [Server]'s
// (copied from the cached template, on 127.0.0.1 on a port of its own, removed by Close). The
// coordinator is registered with citus_set_coordinator_host and each worker with citus_add_node,
// in the postgres database and in every database CreateDatabase makes, so distributed tables can be
// created there at once. Every node has the same superuser password, which the nodes use to
// connect to each other (from a password file private to them, not from a catalog table), and
// which travels only in the URLs Citus returns.
//
// Methods are safe for concurrent use, except that a worker's Kill and Restart, and Close, are
// meant to be called one at a time.
type Citus struct {
	coordinator *localCluster
	workers     []*CitusWorker
	version     string // of PostgreSQL
	citus       string // of the extension, "13.2-1"
	logf        func(format string, args ...any)

	mu      sync.Mutex
	created []string // databases made by CreateDatabase

	closeOnce sync.Once
	closeErr  error
}

// CitusWorker is one worker node of a [Citus] cluster.
type CitusWorker struct {
	cluster *localCluster
	logf    func(format string, args ...any)
}

// NewCitus starts a Citus cluster of the test's own, and stops it and removes its directories when
// the test ends: for tests that kill or restart a node, which would disturb every other test on a
// shared one. When Citus is not installed the test is skipped with a loud note (see
// [SharedCitus]); any other error fails it.
func NewCitus(t testing.TB, opts *CitusOptions) *Citus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), citusStartTimeout)
	defer cancel()
	cluster, err := StartCitus(ctx, opts)
	skipWithoutCitus(t, err)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.Close(); err != nil {
			t.Errorf("%v", err)
		}
	})
	return cluster
}

// StartCitus starts a coordinator and opts.Workers workers, in parallel, from the cached template,
// with shared_preload_libraries=citus, creates the citus extension on each and registers the nodes
// with the coordinator. The context bounds the start only. An error wrapping [ErrNoCitus] means
// this machine has no Citus (or no PostgreSQL binaries) to make a cluster from; its message names
// the directory that was searched.
func StartCitus(ctx context.Context, opts *CitusOptions) (*Citus, error) {
	if opts == nil {
		opts = &CitusOptions{}
	}
	workers := opts.Workers
	if workers == 0 {
		workers = defaultCitusWorkers
	}
	if workers < 0 {
		return nil, fmt.Errorf("pgtest: a Citus cluster needs at least one worker, not %d", workers)
	}
	settings := append(slices.Clip(citusSettings), opts.Settings...)
	cfg, err := (&Options{Mode: ModeLocal, TempDir: opts.TempDir, Logf: opts.Logf, Settings: settings}).config()
	if err != nil {
		return nil, err
	}
	began := time.Now()
	env, err := prepareLocal(ctx, cfg)
	if err != nil {
		var unavailableErr *unavailableError
		if errors.As(err, &unavailableErr) {
			return nil, fmt.Errorf("%w (Citus needs the local PostgreSQL binaries: %v)", ErrNoCitus, err)
		}
		return nil, err
	}
	if err := findCitus(env.binDir); err != nil {
		return nil, err
	}

	c := &Citus{version: env.version, logf: cfg.logf}
	fail := func(err error) (*Citus, error) { return nil, errors.Join(err, c.Close()) }

	// One password for every node: the nodes connect to each other as postgres, with the password
	// from a file private to them that libpq finds through PGPASSFILE.
	password := randomHex(16)
	nodes := make([]*localCluster, 1+workers)
	for i := range nodes {
		node, err := env.newCluster(cfg.settings)
		if err != nil {
			return fail(err)
		}
		nodes[i] = node
		if i == 0 {
			c.coordinator = node
		} else {
			c.workers = append(c.workers, &CitusWorker{cluster: node, logf: cfg.logf})
		}
		node.password = password
		passFile := filepath.Join(node.workDir, "pgpass")
		if err := writePrivateFile(passFile, "127.0.0.1:*:*:postgres:"+password+"\n", env.account); err != nil {
			return fail(err)
		}
		// HOME too: libpq looks there for client certificates (Citus asks for sslmode=require), and
		// ours, root's say, is not the postgres user's to read.
		node.extraEnv = []string{"PGPASSFILE=" + passFile, "HOME=" + node.workDir}
	}

	// Each node's copy, password, start and CREATE EXTENSION are its own: in parallel they take
	// little longer than one.
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, node := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = node.startCitusNode(ctx)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fail(err)
	}
	nodesStarted := time.Now()

	conn, err := pgx.Connect(ctx, c.coordinator.adminURL())
	if err != nil {
		return fail(fmt.Errorf("pgtest: connect to the Citus coordinator: %w", err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := c.registerNodes(ctx, conn); err != nil {
		return fail(fmt.Errorf("pgtest: register the Citus nodes in database postgres: %w", err))
	}
	if err := conn.QueryRow(ctx, "SELECT extversion FROM pg_extension WHERE extname = 'citus'").Scan(&c.citus); err != nil {
		return fail(fmt.Errorf("pgtest: the citus extension's version: %w", err))
	}

	ports := make([]string, len(c.workers))
	for i, w := range c.workers {
		ports[i] = strconv.Itoa(w.cluster.port)
	}
	cfg.logf("pgtest: Citus %s on PostgreSQL %s ready in %s (nodes started in parallel in %s, registered in %s): coordinator 127.0.0.1:%d, workers on ports %s",
		c.citus, c.version, time.Since(began).Round(time.Millisecond), nodesStarted.Sub(began).Round(time.Millisecond),
		time.Since(nodesStarted).Round(time.Millisecond), c.coordinator.port, strings.Join(ports, ", "))
	return c, nil
}

// findCitus reports, wrapping ErrNoCitus, when citus.so is not in the server's library directory
// ($libdir, where shared_preload_libraries=citus loads it from).
func findCitus(binDir string) error {
	dirs := citusLibDirs(binDir)
	for _, dir := range dirs {
		if info, err := os.Stat(filepath.Join(dir, "citus.so")); err == nil && info.Mode().IsRegular() {
			return nil
		}
	}
	return fmt.Errorf("%w (no citus.so in %s)", ErrNoCitus, strings.Join(dirs, " or "))
}

// citusLibDirs are where the server in binDir loads extensions from: what the pg_config beside it,
// or a pg_config on PATH for the same binaries, says is its --pkglibdir, else the bin directory's
// sibling lib directory (Debian's /usr/lib/postgresql/15/{bin,lib}).
func citusLibDirs(binDir string) []string {
	var dirs []string
	add := func(dir string) {
		if dir != "" && !slices.Contains(dirs, dir) {
			dirs = append(dirs, dir)
		}
	}
	pgConfigs := []string{filepath.Join(binDir, "pg_config")}
	if onPath, err := exec.LookPath("pg_config"); err == nil {
		pgConfigs = append(pgConfigs, onPath)
	}
	for _, pgConfig := range pgConfigs {
		out, err := exec.Command(pgConfig, "--bindir", "--pkglibdir").Output()
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) != 2 || !sameDir(strings.TrimSpace(lines[0]), binDir) {
			continue // another installation's
		}
		add(strings.TrimSpace(lines[1]))
	}
	if len(dirs) == 0 {
		add(filepath.Join(filepath.Dir(binDir), "lib"))
	}
	return dirs
}

func sameDir(a, b string) bool {
	if realA, err := filepath.EvalSymlinks(a); err == nil {
		a = realA
	}
	if realB, err := filepath.EvalSymlinks(b); err == nil {
		b = realB
	}
	return filepath.Clean(a) == filepath.Clean(b)
}

// writePrivateFile writes a file only account (or we, when it is nil) may read.
func writePrivateFile(path, content string, account *runAs) error {
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return fmt.Errorf("pgtest: write %s: %w", path, err)
	}
	if account != nil {
		if err := os.Chown(path, account.uid, account.gid); err != nil {
			return fmt.Errorf("pgtest: hand %s to user %s: %w", path, account.name, err)
		}
	}
	return nil
}

// startCitusNode makes the node's data directory from the template, starts it and creates the
// citus extension in its postgres database.
func (c *localCluster) startCitusNode(ctx context.Context) error {
	if err := c.fromTemplate(ctx); err != nil {
		return err
	}
	if err := c.start(ctx); err != nil {
		return fmt.Errorf("pgtest: start a Citus node: %w", err)
	}
	return createCitusExtension(ctx, c.adminURL())
}

func createCitusExtension(ctx context.Context, nodeURL string) error {
	conn, err := pgx.Connect(ctx, nodeURL)
	if err != nil {
		return fmt.Errorf("pgtest: connect to a Citus node: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS citus"); err != nil {
		return fmt.Errorf("pgtest: CREATE EXTENSION citus on %s: %w", redactURL(nodeURL), err)
	}
	return nil
}

// registerNodes tells the coordinator, in the database conn is connected to, where it is and where
// its workers are. citus_add_node also syncs the metadata to each worker's database of the same
// name, so workers can route queries too.
func (c *Citus) registerNodes(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, "SELECT citus_set_coordinator_host('127.0.0.1', $1)", c.coordinator.port); err != nil {
		return fmt.Errorf("citus_set_coordinator_host: %w", err)
	}
	for _, w := range c.workers {
		if _, err := conn.Exec(ctx, "SELECT citus_add_node('127.0.0.1', $1)", w.cluster.port); err != nil {
			return fmt.Errorf("citus_add_node of the worker on port %d: %w", w.cluster.port, err)
		}
	}
	return nil
}

// URL connects to the coordinator's postgres database as the postgres superuser: the database the
// nodes are registered in from the start.
func (c *Citus) URL() string { return c.coordinator.adminURL() }

// Workers are the worker nodes, in the order they were added.
func (c *Citus) Workers() []*CitusWorker { return slices.Clip(c.workers) }

// Version is the citus extension's version, such as "13.2-1".
func (c *Citus) Version() string { return c.citus }

// CreateDatabase creates a database named prefix_<random hex> on every node, with the citus
// extension in it on each and the nodes registered in it on the coordinator (Citus's metadata is
// per database), and returns the coordinator's URL to it. An empty prefix means "idem_test". Close
// drops nothing: the cluster goes away whole.
func (c *Citus) CreateDatabase(ctx context.Context, prefix string) (string, error) {
	if prefix == "" {
		prefix = "idem_test"
	}
	if !prefixPattern.MatchString(prefix) {
		return "", fmt.Errorf("%w: database prefix %q must be a lowercase letter followed by at most 39 lowercase letters, digits or underscores",
			ErrInvalidName, prefix)
	}
	name := prefix + "_" + randomHex(8)
	nodes := append([]*localCluster{c.coordinator}, c.workerClusters()...)
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, node := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = createDatabaseWithCitus(ctx, node, name)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	dbURL := withDatabase(c.coordinator.adminURL(), name)
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return "", fmt.Errorf("pgtest: connect to database %s on the Citus coordinator: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := c.registerNodes(ctx, conn); err != nil {
		return "", fmt.Errorf("pgtest: register the Citus nodes in database %s: %w", name, err)
	}
	c.mu.Lock()
	c.created = append(c.created, name)
	c.mu.Unlock()
	return dbURL, nil
}

func createDatabaseWithCitus(ctx context.Context, node *localCluster, name string) error {
	conn, err := pgx.Connect(ctx, node.adminURL())
	if err != nil {
		return fmt.Errorf("pgtest: connect to a Citus node: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("pgtest: create database %s on the Citus node on port %d: %w", name, node.port, err)
	}
	return createCitusExtension(ctx, withDatabase(node.adminURL(), name))
}

// withDatabase is a URL made by localCluster.url, to database name instead of postgres.
func withDatabase(rawURL, name string) string {
	return strings.Replace(rawURL, "/postgres?", "/"+name+"?", 1)
}

func (c *Citus) workerClusters() []*localCluster {
	clusters := make([]*localCluster, len(c.workers))
	for i, w := range c.workers {
		clusters[i] = w.cluster
	}
	return clusters
}

// Close stops every node and removes its directory. It is safe to call more than once.
func (c *Citus) Close() error {
	c.closeOnce.Do(func() {
		var errs []error
		for _, node := range append(c.workerClusters(), c.coordinator) {
			if node != nil {
				errs = append(errs, node.stop())
			}
		}
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}

// Port is the worker's port on 127.0.0.1, the same across Restart.
func (w *CitusWorker) Port() int { return w.cluster.port }

// URL connects to the worker's postgres database directly, as the postgres superuser.
func (w *CitusWorker) URL() string { return w.cluster.adminURL() }

// Kill kills the worker as a crash would, with no shutdown of any kind: SIGKILL to its postmaster
// and each of its processes (see [Pair.KillPrimary]). Its data directory stays, for Restart.
func (w *CitusWorker) Kill() error {
	if err := w.cluster.crash(); err != nil {
		return err
	}
	w.logf("pgtest: Citus worker 127.0.0.1:%d killed", w.cluster.port)
	return nil
}

// Restart starts a killed (or stopped) worker again, on the same port and data directory, and
// returns once it accepts connections, its crash recovery done. The coordinator's connections to
// the old process are broken; Citus opens new ones as it needs them. Prepared transactions of
// two-phase commits the worker had not finished are resolved by the coordinator's maintenance
// daemon (every citus.recover_2pc_interval, a minute by default) or at once by
// SELECT recover_prepared_transactions() on the coordinator. The previous server log is kept
// beside the new one as server.log.<n>.
func (w *CitusWorker) Restart(ctx context.Context) error {
	c := w.cluster
	if c.cmd != nil {
		select {
		case <-c.exited:
		default:
			return errors.New("pgtest: restart: the Citus worker is still running")
		}
	}
	logPath := filepath.Join(c.workDir, "server.log")
	for n := 1; ; n++ {
		kept := logPath + "." + strconv.Itoa(n)
		if _, err := os.Stat(kept); err == nil {
			continue
		}
		if err := os.Rename(logPath, kept); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("pgtest: restart: keep the server log: %w", err)
		}
		break
	}
	began := time.Now()
	if err := c.runOn(ctx, c.port); err != nil {
		return fmt.Errorf("pgtest: restart the Citus worker on port %d: %w", c.port, err)
	}
	w.logf("pgtest: Citus worker 127.0.0.1:%d restarted in %s", c.port, time.Since(began).Round(time.Millisecond))
	return nil
}

// Alive reports whether the worker's postmaster is running.
func (w *CitusWorker) Alive() bool {
	if w.cluster.cmd == nil {
		return false
	}
	select {
	case <-w.cluster.exited:
		return false
	default:
		return true
	}
}

// sharedCitus is the test binary's Citus cluster, started by the first test that asks.
var sharedCitus struct {
	mu      sync.Mutex
	started bool
	cluster *Citus
	pool    *pgxpool.Pool // to the coordinator's postgres database, for creating and dropping schemas
	err     error
}

// SharedCitus returns the test binary's Citus cluster (a coordinator and two workers), starting it
// on first use; [Main] stops it. Tests share it, each in a schema of its own ([NewCitusSchema]), so
// they must not kill or restart its nodes: a test that does starts its own with [NewCitus]. When
// Citus is not installed the test is skipped, with a loud note in the test output and on stderr
// naming the directory where citus.so was looked for.
func SharedCitus(t testing.TB) *Citus {
	t.Helper()
	cluster, _ := sharedCitusFor(t)
	return cluster
}

// sharedCitusFor is the shared cluster and a pool to its coordinator, or the test skipped
// (without Citus) or failed (any other error).
func sharedCitusFor(t testing.TB) (*Citus, *pgxpool.Pool) {
	t.Helper()
	cluster, admin, err := sharedCitusCluster()
	skipWithoutCitus(t, err)
	if err != nil {
		t.Fatal(err)
	}
	return cluster, admin
}

// NewCitusSchema is [NewSchema] on the test binary's Citus cluster ([SharedCitus]): an empty schema
// of the test's own in the coordinator's postgres database, where the nodes are registered. Citus
// creates the schema on the workers too when a table in it is distributed. Schema.URL and
// Schema.Pool connect to the coordinator with search_path set to the schema. When the test ends the
// pool is closed and the schema dropped with everything in it, distributed tables and their shards
// included. Skipped loudly when Citus is not installed.
func NewCitusSchema(t testing.TB) *Schema {
	t.Helper()
	cluster, admin := sharedCitusFor(t)
	schema, drop, err := openSchemaIn(context.Background(), cluster.URL(), admin)
	return forTest(t, schema, drop, err)
}

// sharedCitusCluster starts the shared cluster once. A failure is remembered, so every test
// reports the same error (or note) rather than each retrying a slow start.
func sharedCitusCluster() (*Citus, *pgxpool.Pool, error) {
	sharedCitus.mu.Lock()
	defer sharedCitus.mu.Unlock()
	if sharedCitus.started {
		return sharedCitus.cluster, sharedCitus.pool, sharedCitus.err
	}
	sharedCitus.started = true
	ctx, cancel := context.WithTimeout(context.Background(), citusStartTimeout)
	defer cancel()
	cluster, err := StartCitus(ctx, nil)
	if err != nil {
		sharedCitus.err = err
		return nil, nil, err
	}
	poolConfig, err := pgxpool.ParseConfig(cluster.URL())
	if err == nil {
		poolConfig.MaxConns = 4
		sharedCitus.pool, err = pgxpool.NewWithConfig(ctx, poolConfig)
	}
	if err != nil {
		sharedCitus.err = errors.Join(fmt.Errorf("pgtest: pool for the Citus coordinator: %w", err), cluster.Close())
		return nil, nil, sharedCitus.err
	}
	sharedCitus.cluster = cluster
	return cluster, sharedCitus.pool, nil
}

func stopSharedCitus() error {
	sharedCitus.mu.Lock()
	defer sharedCitus.mu.Unlock()
	if sharedCitus.cluster == nil {
		return nil
	}
	sharedCitus.pool.Close()
	err := sharedCitus.cluster.Close()
	sharedCitus.cluster, sharedCitus.pool, sharedCitus.err = nil, nil, ErrClosed
	return err
}

// skipWithoutCitus skips the test, loudly, when err says Citus is not installed.
func skipWithoutCitus(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, ErrNoCitus) {
		note := noCitusNote(t.Name(), err)
		fmt.Fprint(os.Stderr, note)
		t.Skip(note)
	}
}

// noCitusNote is what a test that needs Citus prints when there is none: loud, so that a run
// without Citus is not mistaken for one that tested it.
func noCitusNote(test string, err error) string {
	reason := strings.TrimPrefix(err.Error(), ErrNoCitus.Error())
	reason = strings.TrimSpace(strings.TrimPrefix(reason, ":"))
	bar := strings.Repeat("!", 80)
	return fmt.Sprintf("\n%s\n!!! NOTE: Citus not installed %s: Citus tests NOT run (%s skipped).\n%s\n",
		bar, reason, test, bar)
}
