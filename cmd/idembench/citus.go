package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/migrations"
)

// The Citus point: the three-phase rides flow through the runner with keys
// spread over many scopes, on a Citus cluster the run starts (a coordinator
// and two workers, idem's tables distributed by scope with migrations'
// Citus layout, the rides and jobs distributed by the same scope and
// co-located with them), against the run's plain server, at each client
// concurrency, in alternating rounds. All of it on one machine: the
// coordinator, both workers, the plain server and this process share its
// cores. That makes it an indication of what Citus's routing costs in CPU
// and latency, not of what a cluster with a machine per node scales to.

// citusScopes is how many scopes the Citus point's keys are spread over:
// many more than the 32 shards, so that every shard, and both workers, get
// their share.
const citusScopes = 1000

// citusReport is the Citus section of the report.
type citusReport struct {
	// Note says why the section measured nothing (Citus not installed).
	Note string
	// Version is the citus extension's, Workers the number of workers.
	Version string
	Workers int
	// Settings are the durability settings both sides ran with.
	Settings string
	// NodeConninfo is how the coordinator connects to the workers
	// (citus.node_conninfo: Citus's default asks for TLS).
	NodeConninfo string
	// Points hold "plain" and "citus" figures at each concurrency.
	Points []*loadPoint
	// CPU is the server CPU per request, by point and then by side:
	// "plain", "coordinator" and "workers"; negative when unknown.
	CPU []map[string]time.Duration
	// KeysPerWorker counts the run's keys on each worker, by port.
	KeysPerWorker [][2]int
}

// scopedTables are the rides and jobs of the Citus point, on both sides:
// the scope in every row, the column Citus distributes them by. No foreign
// key to idem_keys on either side (Citus would want one naming the scope,
// and refuses its ON DELETE SET NULL), so both do the same work.
const scopedTables = `
CREATE TABLE scoped_rides (
    scope     text   NOT NULL,
    id        bigserial,
    key_id    bigint NOT NULL,
    user_id   bigint NOT NULL,
    origin    text   NOT NULL,
    amount    bigint NOT NULL,
    charge_id text,
    PRIMARY KEY (scope, id)
);
CREATE TABLE scoped_jobs (
    scope   text   NOT NULL,
    id      bigserial,
    kind    text   NOT NULL,
    ride_id bigint NOT NULL,
    args    jsonb  NOT NULL,
    PRIMARY KEY (scope, id)
);`

// newScopedFlow is the rides flow of the load section with the key's scope
// in every business statement, so that on Citus each phase's transaction
// stays on the worker that holds the key.
func newScopedFlow() *idem.Flow[rideInput] {
	return ridesFlow(flowName+".scoped", joinNone, rideStatements{
		insertRide: `INSERT INTO scoped_rides (scope, key_id, user_id, origin, amount) VALUES ($1, $2, $3, $4, $5) RETURNING id`,
		chargeRide: `UPDATE scoped_rides SET charge_id = $2 WHERE scope = $1 AND id = $3`,
		insertJob:  `INSERT INTO scoped_jobs (scope, kind, ride_id, args) VALUES ($1, 'receipt', $2, $3)`,
		scoped:     true,
	})
}

// citusSide is one side of the comparison: a pool, a runner on it, and the
// server processes whose CPU it uses.
type citusSide struct {
	name   string
	pool   *pgxpool.Pool
	runner *idem.Runner
	// nodes are the postmasters by the name the report gives their CPU:
	// "plain", or "coordinator" and "workers".
	nodes map[string][]int
}

// measureCitus starts a Citus cluster, lays out idem's tables on it, and
// measures the scoped flow on it and on the run's plain server. Without
// Citus it says so, loudly, and returns a report holding only that note.
func measureCitus(ctx context.Context, e *env, o *options, logf func(string, ...any)) (*citusReport, error) {
	settings := []string{"synchronous_commit=off"} // pgtest's plain default; the harness's Citus nodes have it on
	if o.Durable {
		settings = durableSettings
	}
	if o.SharedBuffers != "" {
		settings = append(settings, "shared_buffers="+o.SharedBuffers)
	}
	cluster, err := pgtest.StartCitus(ctx, &pgtest.CitusOptions{Logf: logf, Settings: settings})
	if errors.Is(err, pgtest.ErrNoCitus) {
		note := fmt.Sprintf("NOTE: Citus not installed %s: the Citus point NOT measured",
			strings.TrimSpace(strings.TrimPrefix(err.Error(), pgtest.ErrNoCitus.Error())))
		bar := strings.Repeat("!", 80)
		logf("%s\n!!! %s\n%s", bar, note, bar)
		return &citusReport{Note: note}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("start a Citus cluster: %w", err)
	}
	defer func() {
		if err := cluster.Close(); err != nil {
			logf("idembench: stopping the Citus cluster: %v", err)
		}
	}()
	rep := &citusReport{Version: cluster.Version(), Workers: len(cluster.Workers())}

	plain, err := plainSide(ctx, e)
	if err != nil {
		return nil, err
	}
	distributed, err := distributedSide(ctx, cluster, e.schema, o.MaxConns, e.runtimeParams)
	if err != nil {
		return nil, err
	}
	defer distributed.pool.Close()
	if err := distributed.pool.QueryRow(ctx,
		"SELECT string_agg(name || '=' || setting, ', ' ORDER BY name) FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes')").
		Scan(&rep.Settings); err != nil {
		return nil, err
	}
	if err := distributed.pool.QueryRow(ctx, "SHOW citus.node_conninfo").Scan(&rep.NodeConninfo); err != nil {
		return nil, err
	}

	flow := newScopedFlow()
	run := randomHex(4)
	var seq atomic.Int64
	sideOp := func(s *citusSide) op {
		return func(ctx context.Context, w, i int) error {
			n := seq.Add(1)
			scope := "user:" + strconv.FormatInt(n%citusScopes, 10)
			key := "c-" + run + "-" + strconv.FormatInt(n, 10)
			return execute(ctx, s.runner, flow, scope, key, requestInput(w, i), idem.OutcomeExecuted)
		}
	}
	sides := []*citusSide{plain, distributed}
	variants := []variant{{plain.name, sideOp(plain)}, {distributed.name, sideOp(distributed)}}
	// Warm every connection of both pools first, as the load section does.
	if err := warmPool(ctx, slices.Max(o.Concurrency), min(2*time.Second, o.Duration), variants); err != nil {
		return nil, fmt.Errorf("citus: %w", err)
	}
	for _, c := range o.Concurrency {
		logf("idembench: citus: concurrency %d, plain and Citus, %s each", c, o.Duration)
		// The servers' CPU, by node group, and the requests, by side, over
		// the point's rounds; negative CPU when unknown.
		cpuSpent, opsDone := map[string]time.Duration{}, map[string]int64{}
		meter := func(_ context.Context, v variant) (func(*stats) error, error) {
			side := sides[slices.IndexFunc(sides, func(s *citusSide) bool { return s.name == v.name })]
			before := nodeCPU(side.nodes)
			return func(s *stats) error {
				for name, d := range nodeCPU(side.nodes) {
					if b, ok := before[name]; ok && b >= 0 && d >= 0 && cpuSpent[name] >= 0 {
						cpuSpent[name] += d - b
					} else {
						cpuSpent[name] = -1
					}
				}
				opsDone[v.name] += s.allOps
				return nil
			}, nil
		}
		got, err := interleaved(ctx, c, o.Rounds, o.Warmup, o.Duration, variants, meter)
		if err != nil {
			return nil, fmt.Errorf("citus: %w", err)
		}
		perRequest := map[string]time.Duration{}
		for _, s := range sides {
			for name := range s.nodes {
				perRequest[name] = -1
				if cpuSpent[name] >= 0 && opsDone[s.name] > 0 {
					perRequest[name] = cpuSpent[name] / time.Duration(opsDone[s.name])
				}
			}
		}
		point := &loadPoint{Concurrency: c, Stats: got}
		logf("idembench:   plain %.0f/s, Citus %.0f/s", point.Stats["plain"].Throughput(), point.Stats["citus"].Throughput())
		rep.Points = append(rep.Points, point)
		rep.CPU = append(rep.CPU, perRequest)
	}
	if rep.KeysPerWorker, err = keysPerWorker(ctx, distributed.pool, e.schema); err != nil {
		return nil, err
	}
	return rep, nil
}

// plainSide is the run's own server, with the scoped tables in the run's
// schema.
func plainSide(ctx context.Context, e *env) (*citusSide, error) {
	if _, err := e.pool.Exec(ctx, scopedTables); err != nil {
		return nil, fmt.Errorf("citus: the plain side's tables: %w", err)
	}
	// The store stays open for the run: its pool is the run's, closed at the
	// end.
	runner, _, err := newRunner(e.pool, e.schema, idem.Config{})
	if err != nil {
		return nil, err
	}
	s := &citusSide{name: "plain", pool: e.pool, runner: runner, nodes: map[string][]int{}}
	if pid, err := postmasterPID(ctx, e.pool); err == nil {
		s.nodes["plain"] = []int{pid}
	} else {
		s.nodes["plain"] = nil
	}
	return s, nil
}

// distributedSide makes the run's schema on the cluster's coordinator, migrates
// it with the Citus layout, distributes the scoped tables co-located with
// idem_keys, and opens a pool and a runner on it.
func distributedSide(ctx context.Context, cluster *pgtest.Citus, schema string, maxConns int, params map[string]string) (*citusSide, error) {
	admin, err := pgx.Connect(ctx, cluster.URL())
	if err != nil {
		return nil, fmt.Errorf("citus: connect to the coordinator: %w", err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return nil, fmt.Errorf("citus: create schema: %w", err)
	}
	cfg, err := pgxpool.ParseConfig(cluster.URL())
	if err != nil {
		return nil, err
	}
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns, cfg.MinConns = int32(maxConns), int32(maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("citus: pool: %w", err)
	}
	fail := func(err error) (*citusSide, error) { pool.Close(); return nil, err }
	m, err := migrations.New(pool, &migrations.Config{Schema: schema, Citus: true})
	if err != nil {
		return fail(err)
	}
	if _, err := m.Up(ctx); err != nil {
		return fail(fmt.Errorf("citus: migrate with the Citus layout: %w", err))
	}
	if _, err := pool.Exec(ctx, scopedTables); err != nil {
		return fail(fmt.Errorf("citus: the scoped tables: %w", err))
	}
	keys := schema + ".idem_keys"
	for _, table := range []string{"scoped_rides", "scoped_jobs"} {
		if _, err := pool.Exec(ctx, "SELECT create_distributed_table($1, 'scope', colocate_with => $2)", schema+"."+table, keys); err != nil {
			return fail(fmt.Errorf("citus: distribute %s: %w", table, err))
		}
	}
	runner, store, err := newRunner(pool, schema, idem.Config{})
	if err != nil {
		return fail(err)
	}
	if !store.Distributed() {
		return fail(errors.New("citus: the store does not see idem_keys distributed"))
	}
	s := &citusSide{name: "citus", pool: pool, runner: runner, nodes: map[string][]int{}}
	if pid, err := postmasterPID(ctx, pool); err == nil {
		s.nodes["coordinator"] = []int{pid}
	} else {
		s.nodes["coordinator"] = nil
	}
	s.nodes["workers"] = nil
	var workers []int
	for _, w := range cluster.Workers() {
		conn, err := pgxpool.New(ctx, w.URL())
		if err != nil {
			return fail(err)
		}
		pid, err := postmasterPID(ctx, conn)
		conn.Close()
		if err != nil {
			workers = nil
			break
		}
		workers = append(workers, pid)
	}
	s.nodes["workers"] = workers
	return s, nil
}

// postmasterPID reads the server's postmaster pid from its postmaster.pid,
// which a superuser may read with pg_read_file; an error elsewhere.
func postmasterPID(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var file string
	if err := pool.QueryRow(ctx, "SELECT pg_read_file('postmaster.pid')").Scan(&file); err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(file, "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0, fmt.Errorf("postmaster.pid: %w", err)
	}
	if _, err := procCPU(pid); err != nil {
		return 0, err // a server on another machine, or /proc unreadable
	}
	return pid, nil
}

// nodeCPU is the CPU each group of servers has used so far: each
// postmaster's own, its exited children's (which it has waited for) and
// its live children's. Negative when unknown.
func nodeCPU(nodes map[string][]int) map[string]time.Duration {
	out := map[string]time.Duration{}
	children := childrenOf()
	for name, pids := range nodes {
		if len(pids) == 0 {
			out[name] = -1
			continue
		}
		var total time.Duration
		for _, pid := range pids {
			self, err := procCPUWithChildren(pid)
			if err != nil {
				total = -1
				break
			}
			total += self
			for _, child := range children[pid] {
				if d, err := procCPU(child); err == nil {
					total += d
				}
			}
		}
		out[name] = total
	}
	return out
}

// procCPUWithChildren is procCPU plus the CPU of the children pid has
// waited for (cutime and cstime, the two fields after stime).
func procCPUWithChildren(pid int) (time.Duration, error) {
	return procTicks(pid, 4)
}

// childrenOf maps each process to its children, from /proc.
func childrenOf() map[int][]int {
	out := map[int][]int{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		ppid, err1 := strconv.Atoi(f[1])
		pid, err2 := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		if err1 == nil && err2 == nil {
			out[ppid] = append(out[ppid], pid)
		}
	}
	return out
}

// keysPerWorker counts the run's keys on each worker, shard by shard.
func keysPerWorker(ctx context.Context, pool *pgxpool.Pool, schema string) ([][2]int, error) {
	rows, err := pool.Query(ctx, `
		SELECT s.nodeport, sum(r.result::bigint)::int
		FROM run_command_on_shards($1, 'SELECT count(*) FROM %s') r
		JOIN citus_shards s ON s.shardid = r.shardid
		GROUP BY s.nodeport ORDER BY s.nodeport`, schema+".idem_keys")
	if err != nil {
		return nil, fmt.Errorf("citus: keys per worker: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) ([2]int, error) {
		var kv [2]int
		err := row.Scan(&kv[0], &kv[1])
		return kv, err
	})
}

// renderCitus is the Citus section of the report.
func renderCitus(rep *citusReport, cores int) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("## 8. Citus: an indication on one box\n\n")
	if rep.Note != "" {
		p("**%s.**\n\n", rep.Note)
		return b.String()
	}
	p("The three-phase rides flow through the runner, a new key per request spread over %d scopes, ", citusScopes)
	p("on a Citus %s cluster this run started (a coordinator and %d workers; idem's tables distributed by scope with the migrations' Citus layout, the rides and jobs by the same scope, co-located with them) ", rep.Version, rep.Workers)
	p("against the run's plain server, in alternating rounds, both with %s; the coordinator reaches the workers with `%s`. ", rep.Settings, rep.NodeConninfo)
	p("**One machine**: the coordinator, the workers, the plain server and this client share its %d cores, so this is what Citus's routing costs in CPU and latency here, not what a cluster with a machine per node scales to.\n\n", cores)
	p("| concurrency | plain req/s | Citus req/s | Citus / plain | plain p50 | p99 | Citus p50 | p99 | server CPU per request (µs): plain | coordinator | workers |\n")
	p("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, lp := range rep.Points {
		plain, citus := lp.workload("plain"), lp.workload("citus")
		cpu := rep.CPU[i]
		p("| %d | %s | %s | **%.2f** | %s | %s | %s | %s | %s | %s | %s |\n", lp.Concurrency, rate(plain), rate(citus),
			ratio(citus.Throughput(), plain.Throughput()), ms(plain.P50), ms(plain.P99), ms(citus.P50), ms(citus.P99),
			micros(cpu["plain"]), micros(cpu["coordinator"]), micros(cpu["workers"]))
	}
	p("\nServer CPU is that of every process of the server (its backends, Citus's and PostgreSQL's background workers), from /proc, warm-up included, per request of its side.\n")
	var spread []string
	for _, kv := range rep.KeysPerWorker {
		spread = append(spread, fmt.Sprintf("%d on the worker on port %d", kv[1], kv[0]))
	}
	p("The run's keys on Citus, warm-up included: %s.\n\n", strings.Join(spread, ", "))
	return b.String()
}
