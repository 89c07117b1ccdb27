package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/migrations"
)

// env is the database a run measures: one server, one database the run
// owns (or one schema of its own in DATABASE_URL's database), and a pool
// sized for the largest concurrency and the duplicate storm.
type env struct {
	// url connects to the run's database; runtimeParams (search_path set
	// to schema, and any settings asked for) go with every connection.
	url           string
	runtimeParams map[string]string
	schema        string
	pool          *pgxpool.Pool
	source        string // "DATABASE_URL" or the pgtest server kind
	// where says where the server runs, for the report; local is true
	// when it shares this machine's kernel (and so its page cache).
	where string
	local bool
	// close drops what the run created and stops what it started.
	close func() error
}

// envConfig is what openEnv needs to know.
type envConfig struct {
	MaxConns int
	// RuntimeParams go with every connection (synchronous_commit, say).
	RuntimeParams map[string]string
	// SharedBuffers sizes a throwaway cluster's buffer cache; empty keeps
	// pgtest's.
	SharedBuffers string
	// Durable starts a throwaway cluster with durable commits (fsync,
	// synchronous_commit and full_page_writes on), and checks that a server
	// it did not start has them: it never changes a server it does not own.
	Durable bool
	Logf    func(string, ...any)
}

// durableSettings are the settings -durable starts a throwaway cluster
// with; pgtest applies them after its own speed-over-durability defaults,
// so they win.
var durableSettings = []string{"fsync=on", "synchronous_commit=on", "full_page_writes=on"}

// errNotDurable is a -durable run on a server without durable commits.
var errNotDurable = errors.New("-durable: the server does not commit durably")

// openEnv connects to DATABASE_URL when it is set and otherwise starts a
// throwaway cluster through pgtest. Either way the run gets a schema that
// did not exist before and is dropped afterwards, so figures never include
// another run's rows.
func openEnv(ctx context.Context, c envConfig) (*env, error) {
	logf := c.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	e := &env{schema: "idembench_" + randomHex(6)}
	var closers []func() error
	e.close = func() error {
		var errs []error
		for i := len(closers) - 1; i >= 0; i-- {
			errs = append(errs, closers[i]())
		}
		return errors.Join(errs...)
	}
	fail := func(err error) (*env, error) { return nil, errors.Join(err, e.close()) }

	dbURL := os.Getenv("DATABASE_URL")
	if dbURL != "" {
		e.source = "DATABASE_URL"
	} else {
		opts := &pgtest.Options{Logf: logf}
		if c.SharedBuffers != "" {
			opts.Settings = append(opts.Settings, "shared_buffers="+c.SharedBuffers)
		}
		if c.Durable {
			opts.Settings = append(opts.Settings, durableSettings...)
		}
		server, err := pgtest.Start(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("start a throwaway Postgres (or set DATABASE_URL): %w", err)
		}
		closers = append(closers, server.Close)
		e.source = "pgtest " + server.Kind()
		if dbURL, err = server.CreateDatabase(ctx, "idembench"); err != nil {
			return fail(err)
		}
		created := dbURL
		closers = append(closers, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			return server.DropDatabase(ctx, created)
		})
	}

	admin, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return fail(fmt.Errorf("connect: %w", err))
	}
	quoted := pgx.Identifier{e.schema}.Sanitize()
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+quoted)
	_ = admin.Close(ctx)
	if err != nil {
		return fail(fmt.Errorf("create schema: %w", err))
	}
	closers = append(closers, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			return fmt.Errorf("drop schema %s: %w", e.schema, err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+quoted+" CASCADE"); err != nil {
			return fmt.Errorf("drop schema %s: %w", e.schema, err)
		}
		return nil
	})

	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return fail(fmt.Errorf("parse database URL: %w", err))
	}
	e.where, e.local = serverLocation(cfg.ConnConfig.Host)
	if e.source != "DATABASE_URL" {
		e.where, e.local = "on the same machine", true
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = e.schema
	for k, v := range c.RuntimeParams {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	cfg.MaxConns = int32(c.MaxConns)
	cfg.MinConns = int32(c.MaxConns)
	if e.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return fail(fmt.Errorf("pool: %w", err))
	}
	closers = append(closers, func() error { e.pool.Close(); return nil })
	e.url = dbURL
	e.runtimeParams = cfg.ConnConfig.RuntimeParams
	if c.Durable {
		// Whether the cluster took the settings, or the server we were
		// given has them: as the pool's connections see them.
		var fsync, syncCommit, fpw string
		if err := e.pool.QueryRow(ctx, "SELECT current_setting('fsync'), current_setting('synchronous_commit'), current_setting('full_page_writes')").
			Scan(&fsync, &syncCommit, &fpw); err != nil {
			return fail(err)
		}
		if fsync != "on" || syncCommit == "off" || fpw != "on" {
			return fail(fmt.Errorf("%w (%s: fsync=%s, synchronous_commit=%s, full_page_writes=%s); a server the run did not start is only checked, never changed",
				errNotDurable, e.source, fsync, syncCommit, fpw))
		}
	}

	m, err := migrations.New(e.pool, &migrations.Config{Schema: e.schema})
	if err != nil {
		return fail(err)
	}
	if _, err := m.Up(ctx); err != nil {
		return fail(fmt.Errorf("migrate: %w", err))
	}
	if _, err := e.pool.Exec(ctx, benchTables); err != nil {
		return fail(fmt.Errorf("create the benchmark's tables: %w", err))
	}
	return e, nil
}

// newPool opens another pool on the run's database with its own settings
// (the round-trip counter needs a single traced connection).
func (e *env) newPool(ctx context.Context, maxConns int, configure func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(e.url)
	if err != nil {
		return nil, err
	}
	for k, v := range e.runtimeParams {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	cfg.MaxConns = int32(maxConns)
	if configure != nil {
		configure(cfg)
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// benchTables are the business tables of the measured flow, three times
// from one definition: once referencing idem's keys (the runner), once the
// hand-rolled baseline's own minimal key table and once the
// single-transaction contender's, so all do exactly the same work.
var benchTables = businessTables("runner", "idem_keys") + `
CREATE TABLE base_keys (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope           text        NOT NULL,
    key             text        NOT NULL,
    fingerprint     bytea       NOT NULL,
    recovery_point  text        NOT NULL DEFAULT 'started',
    locked_at       timestamptz,
    response_status int,
    response_body   bytea,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (scope, key)
);` + businessTables("base", "base_keys") + `
-- The single-transaction contender's: the baseline's shape, its own rows.
CREATE TABLE single_keys (LIKE base_keys INCLUDING ALL);` + businessTables("single", "single_keys") + `
-- The commit ceiling's table: the smallest write that has to commit.
CREATE TABLE commit_probe (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    worker int    NOT NULL,
    n      bigint NOT NULL
);`

// businessTables are one implementation's rides and jobs, prefixed, its
// rides referencing keys.
func businessTables(prefix, keys string) string {
	return strings.NewReplacer("{p}", prefix, "{keys}", keys).Replace(`
CREATE TABLE {p}_rides (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key_id    bigint NOT NULL UNIQUE REFERENCES {keys} (id) ON DELETE SET NULL,
    user_id   bigint NOT NULL,
    origin    text   NOT NULL,
    amount    bigint NOT NULL,
    charge_id text
);
CREATE TABLE {p}_jobs (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind    text   NOT NULL,
    ride_id bigint NOT NULL,
    args    jsonb  NOT NULL
);
`)
}

// serverInfo describes the server and the machine for the report.
type serverInfo struct {
	Version  string
	Settings [][2]string
	CPU      string
	Cores    int
	Go       string
}

func describe(ctx context.Context, pool *pgxpool.Pool) (*serverInfo, error) {
	info := &serverInfo{Cores: runtime.NumCPU(), Go: runtime.Version(), CPU: cpuModel()}
	if err := pool.QueryRow(ctx, "SHOW server_version").Scan(&info.Version); err != nil {
		return nil, err
	}
	rows, err := pool.Query(ctx, `
		SELECT name, current_setting(name)
		FROM pg_settings
		WHERE name = ANY($1)
		ORDER BY name`, []string{"fsync", "synchronous_commit", "full_page_writes", "shared_buffers",
		"max_connections", "wal_level", "max_wal_size", "checkpoint_timeout", "work_mem", "effective_io_concurrency"})
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var kv [2]string
		if err := rows.Scan(&kv[0], &kv[1]); err != nil {
			return nil, err
		}
		info.Settings = append(info.Settings, kv)
	}
	return info, rows.Err()
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if name, value, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(name) == "model name" {
			return strings.TrimSpace(value)
		}
	}
	return runtime.GOARCH
}

// loadAverage returns the first three fields of /proc/loadavg, or "" where
// there is none.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// serverLocation describes a server host for the report and tells whether
// it is this machine: a loopback address or a Unix socket directory.
func serverLocation(host string) (string, bool) {
	switch {
	case strings.HasPrefix(host, "/"):
		return "on the same machine, over a Unix socket", true
	case host == "localhost" || host == "127.0.0.1" || host == "::1":
		return "on the same machine, over TCP to " + host, true
	default:
		return "at " + host + ", over the network", false
	}
}
