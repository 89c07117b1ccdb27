package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
)

// The profile section: where the server's (and the client's) time goes,
// round trip by round trip, on one traced connection, one request at a time.
//
// Every path runs N times after a warm-up, twice: once untraced, for the
// totals per request (this process's CPU from getrusage, the backend's from
// /proc/<pid>/schedstat around the whole pass, wall time), and once traced,
// where the backend's schedstat is read when pgx starts and ends each query
// or batch, so each round trip gets the CPU the backend spent on it.

// profileTrip is one round trip as the tracer saw it.
type profileTrip struct {
	label  string
	server time.Duration // -1: not measured
	wall   time.Duration
}

// profileTracer is a pgx QueryTracer and BatchTracer that reads the
// backend's CPU time before and after every round trip, and labels the trip
// with what it carried and, for the runner, the phase it ran in.
type profileTracer struct {
	mu      sync.Mutex
	on      bool
	sched   *os.File // the backend's /proc/<pid>/schedstat; nil when not readable
	context string   // the runner's phase context for the next trips
	start   time.Time
	cpu0    time.Duration
	batch   []string
	trips   []profileTrip
	err     error
}

var (
	_ pgx.QueryTracer = (*profileTracer)(nil)
	_ pgx.BatchTracer = (*profileTracer)(nil)
)

// schedCPU is the first field of /proc/<pid>/schedstat: nanoseconds on the
// CPU, kept by the scheduler (exact, unlike /proc/<pid>/stat's ticks).
func schedCPU(f *os.File) (time.Duration, error) {
	var buf [128]byte
	n, err := f.ReadAt(buf[:], 0)
	if n == 0 && err != nil {
		return 0, err
	}
	field, _, _ := strings.Cut(string(buf[:n]), " ")
	ns, err := strconv.ParseInt(strings.TrimSpace(field), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("unexpected schedstat %q", buf[:n])
	}
	return time.Duration(ns), nil
}

func (t *profileTracer) begin() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.on {
		return
	}
	t.cpu0 = -1
	if t.sched != nil {
		d, err := schedCPU(t.sched)
		if err != nil && t.err == nil {
			t.err = err
		}
		t.cpu0 = d
	}
	t.start = time.Now()
}

func (t *profileTracer) end(sqls []string) {
	wall := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.on {
		return
	}
	trip := profileTrip{server: -1, wall: wall.Sub(t.start)}
	if t.sched != nil && t.cpu0 >= 0 {
		d, err := schedCPU(t.sched)
		if err != nil && t.err == nil {
			t.err = err
		}
		trip.server = d - t.cpu0
	}
	trip.label = describeTrip(sqls)
	if t.context != "" {
		trip.label = t.context + ": " + trip.label
	}
	t.trips = append(t.trips, trip)
}

// TraceQueryStart implements pgx.QueryTracer.
func (t *profileTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	t.begin()
	return context.WithValue(ctx, profileSQLKey{}, data.SQL)
}

type profileSQLKey struct{}

// TraceQueryEnd implements pgx.QueryTracer.
func (t *profileTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	sql, _ := ctx.Value(profileSQLKey{}).(string)
	t.end([]string{sql})
}

// TraceBatchStart implements pgx.BatchTracer.
func (t *profileTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	t.mu.Lock()
	t.batch = nil
	t.mu.Unlock()
	t.begin()
	return ctx
}

// TraceBatchQuery implements pgx.BatchTracer.
func (t *profileTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	t.mu.Lock()
	t.batch = append(t.batch, data.SQL)
	t.mu.Unlock()
}

// TraceBatchEnd implements pgx.BatchTracer: the whole batch is one trip.
func (t *profileTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {
	t.mu.Lock()
	sqls := t.batch
	t.batch = nil
	t.mu.Unlock()
	t.end(sqls)
}

func (t *profileTracer) setContext(c string) {
	t.mu.Lock()
	t.context = c
	t.mu.Unlock()
}

var (
	sqlSpace   = regexp.MustCompile(`\s+`)
	sqlComment = regexp.MustCompile(`/\*.*?\*/|--[^\n]*`)
	sqlTable   = regexp.MustCompile(`(?i)\b(?:into|update|from)\s+([a-z_][a-z0-9_.]*)`)
)

// describeTrip names a round trip by what it carried: a fixed name for the
// statements the benchmark knows, otherwise each statement's verb and first
// table, joined by " + ".
func describeTrip(sqls []string) string {
	var parts []string
	for _, sql := range sqls {
		if transactionSetting.MatchString(sql) {
			// The store's per-transaction timeouts, sent with BEGIN: part of
			// beginning, not work of their own.
			continue
		}
		parts = append(parts, describeStatement(sql))
	}
	if len(parts) == 0 {
		return "empty batch"
	}
	return strings.Join(parts, " + ")
}

// transactionSetting matches a set_config of a setting local to the
// transaction (statement_timeout, idle_in_transaction_session_timeout).
var transactionSetting = regexp.MustCompile(`(?is)^\s*SELECT\s+set_config\(\s*'[a-z_]+'\s*,\s*\$\d+\s*,\s*true\s*\)(\s*,\s*set_config\(\s*'[a-z_]+'\s*,\s*\$\d+\s*,\s*true\s*\))*\s*$`)

func describeStatement(sql string) string {
	switch sql {
	case baseAcquireSQL, singleAcquireSQL:
		return "claim (INSERT ON CONFLICT)"
	case baseLookupSQL, singleLookupSQL:
		return "look up key (SELECT)"
	case baseAdvanceSQL:
		return "recovery point (UPDATE)"
	case baseFinishSQL, singleFinishSQL:
		return "finish key (UPDATE)"
	case profileSelectSQL:
		return "primary-key SELECT"
	}
	s := strings.TrimSpace(sqlSpace.ReplaceAllString(sqlComment.ReplaceAllString(sql, " "), " "))
	verb, _, _ := strings.Cut(s, " ")
	verb = strings.ToUpper(verb)
	switch verb {
	case "BEGIN", "START", "COMMIT", "ROLLBACK", "END":
		return verb
	}
	// The store's statements, recognised by their shape (the store renders
	// them; the benchmark does not see their names).
	lower := strings.ToLower(s)
	switch {
	case strings.Contains(lower, "guarded as (") && strings.Contains(lower, "status = 'finished'"):
		return "guarded finish"
	case strings.Contains(lower, "guarded as ("):
		return "guarded phase update"
	case strings.HasPrefix(lower, "with clock") && strings.Contains(lower, "ins as ("):
		return "acquisition (insert or report)"
	case strings.HasPrefix(lower, "with clock") && strings.Contains(lower, "'none' as acquired"):
		return "acquisition (look up)"
	case strings.HasPrefix(lower, "with clock") && strings.Contains(lower, "inserted as"),
		strings.Contains(lower, "idem_acquire("):
		return "acquisition"
	case strings.HasPrefix(lower, "with clock") && strings.Contains(lower, "taken"):
		return "take-over"
	}
	if m := sqlTable.FindStringSubmatch(s); m != nil {
		table := m[1]
		if i := strings.LastIndexByte(table, '.'); i >= 0 {
			table = table[i+1:]
		}
		return verb + " " + table
	}
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	return s
}

// isPostgres says whether process pid on this machine is a Postgres
// process, so a backend pid of a server elsewhere is not read here.
func isPostgres(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return err == nil && strings.Contains(string(b), "postgres")
}

// profileSelectSQL is the plain primary-key SELECT the replay target
// compares with (the load section's "plain SELECT").
const profileSelectSQL = "SELECT response_status, response_headers, response_body FROM idem_keys WHERE id = $1"

// profileRow is one round trip of a path, averaged over the traced pass.
type profileRow struct {
	Label      string
	PerRequest float64       // how many such trips one request makes
	Server     time.Duration // mean per trip; -1: not measured
	Wall       time.Duration // mean per trip
}

// profilePath is one path's profile.
type profilePath struct {
	Name string
	Rows []profileRow
	// Between is the backend's CPU per request in the traced pass outside
	// every round trip's window (work after it answered); -1: not measured.
	Between time.Duration
	// Per request, in the untraced pass.
	Server time.Duration // -1: not measured
	Client time.Duration
	Wall   time.Duration
}

type profileReport struct {
	N, Warmup int
	Measured  bool // server CPU measured (the server is on this machine)
	Why       string
	Paths     []profilePath
}

// measureProfile runs each path warmup times, then n times untraced and n
// times traced, one request at a time on one connection.
func measureProfile(ctx context.Context, e *env, n, warmup int) (*profileReport, error) {
	tr := &profileTracer{}
	pool, err := e.newPool(ctx, 1, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.Tracer = tr
		cfg.MinConns = 1
		// A liveness ping after a second idle is the pool's, not the
		// request's.
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	})
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	rep := &profileReport{N: n, Warmup: warmup}

	var pid int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return nil, err
	}
	switch {
	case !e.local:
		rep.Why = "the server is not on this machine"
	case !isPostgres(pid):
		rep.Why = fmt.Sprintf("process %d here is not the connection's backend", pid)
	default:
		f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/schedstat")
		if err != nil {
			rep.Why = "the backend's schedstat is not readable: " + err.Error()
			break
		}
		defer f.Close()
		if _, err := schedCPU(f); err != nil {
			rep.Why = err.Error()
			break
		}
		tr.sched, rep.Measured = f, true
	}
	backendCPU := func() time.Duration {
		if tr.sched == nil {
			return -1
		}
		d, err := schedCPU(tr.sched)
		if err != nil {
			return -1
		}
		return d
	}

	runner, store, err := newRunner(pool, e.schema, idem.Config{Test: idemtest.WithHook(idem.TestConfig{}, func(_ context.Context, at idemtest.HookPoint) error {
		switch at.Where {
		case idemtest.HookPhaseStart:
			tr.setContext("phase " + at.Phase)
		case idemtest.HookAfterCommit:
			tr.setContext("after phase " + at.Phase)
		}
		return nil
	})})
	if err != nil {
		return nil, err
	}
	defer store.Close()

	in := rideInput{UserID: 1, Origin: "SF", Amount: 2000}
	run := randomHex(4)
	key := func(tag string, i int) string { return tag + "-" + run + "-" + strconv.Itoa(i) }
	// Keys the new-key paths finished, for the replay paths to replay.
	done := map[string][]string{}
	newKey := func(tag string, exec func(key string) error) func(i int) error {
		return func(i int) error {
			k := key(tag, i)
			if err := exec(k); err != nil {
				return err
			}
			done[tag] = append(done[tag], k)
			return nil
		}
	}
	replay := func(tag string, exec func(key string) error) func(i int) error {
		return func(i int) error {
			keys := done[tag]
			return exec(keys[i%len(keys)])
		}
	}
	runnerPath := func(flow *idem.Flow[rideInput], want idem.OutcomeKind) func(string) error {
		return func(k string) error { return execute(ctx, runner, flow, "user:profile", k, in, want) }
	}
	flow, onetx := newRunnerFlow(), newRidesFlow(joinAll)
	base, sgl := &baseline{pool: pool, pipelined: true}, &single{pool: pool}
	hand := func(fn func(ctx context.Context, scope, key string, in rideInput) (*baseResult, error), wantReplay bool) func(string) error {
		return func(k string) error {
			res, err := fn(ctx, "user:profile", k, in)
			if err == nil && res.replayed != wantReplay {
				err = fmt.Errorf("replayed %v, want %v", res.replayed, wantReplay)
			}
			return err
		}
	}
	var selectIDs []int64
	paths := []struct {
		name string
		op   func(i int) error
		// prepare runs before the path's warm-up.
		prepare func() error
	}{
		{name: "runner, new key", op: newKey("r", runnerPath(flow, idem.OutcomeExecuted))},
		{name: "runner, all joined, new key", op: newKey("r1", runnerPath(onetx, idem.OutcomeExecuted))},
		{name: "runner, replay", op: replay("r", runnerPath(flow, idem.OutcomeReplayed))},
		{name: "baseline (pipelined), new key", op: newKey("b", hand(base.run, false))},
		{name: "baseline (pipelined), replay", op: replay("b", hand(base.run, true))},
		{name: "single tx, new key", op: newKey("s", hand(sgl.run, false))},
		{name: "plain primary-key SELECT", op: func(i int) error {
			var (
				status       int
				header, body []byte
			)
			return pool.QueryRow(ctx, profileSelectSQL, selectIDs[i%len(selectIDs)]).Scan(&status, &header, &body)
		}, prepare: func() error {
			rows, err := pool.Query(ctx, "SELECT id FROM idem_keys WHERE scope = 'user:profile' AND status = 'finished'")
			if err != nil {
				return err
			}
			selectIDs, err = pgx.CollectRows(rows, pgx.RowTo[int64])
			if err == nil && len(selectIDs) == 0 {
				err = errors.New("no finished keys")
			}
			return err
		}},
	}

	for _, p := range paths {
		if p.prepare != nil {
			if err := p.prepare(); err != nil {
				return nil, fmt.Errorf("%s: %w", p.name, err)
			}
		}
		i := 0
		pass := func(count int) error {
			for range count {
				tr.setContext("")
				if err := p.op(i); err != nil {
					return fmt.Errorf("%s: %w", p.name, err)
				}
				i++
			}
			return nil
		}
		if err := pass(warmup); err != nil {
			return nil, err
		}

		// Untraced: the totals per request.
		s0, c0, w0 := backendCPU(), processCPU(), time.Now()
		if err := pass(n); err != nil {
			return nil, err
		}
		wall, client, s1 := time.Since(w0), processCPU()-c0, backendCPU()
		pp := profilePath{Name: p.name, Server: -1, Between: -1, Client: client / time.Duration(n), Wall: wall / time.Duration(n)}
		if s0 >= 0 && s1 >= 0 {
			pp.Server = (s1 - s0) / time.Duration(n)
		}

		// Traced: each round trip.
		tr.mu.Lock()
		tr.on, tr.trips, tr.err = true, nil, nil
		tr.mu.Unlock()
		s0 = backendCPU()
		err := pass(n)
		s1 = backendCPU()
		tr.mu.Lock()
		tr.on = false
		trips, terr := tr.trips, tr.err
		tr.mu.Unlock()
		if err != nil {
			return nil, err
		}
		if terr != nil {
			return nil, fmt.Errorf("%s: read the backend's schedstat: %w", p.name, terr)
		}
		pp.Rows = profileRows(trips, n)
		if s0 >= 0 && s1 >= 0 {
			var sum time.Duration
			for _, t := range trips {
				sum += t.server
			}
			pp.Between = (s1 - s0 - sum) / time.Duration(n)
		}
		rep.Paths = append(rep.Paths, pp)
	}

	// The backend must have been the same process throughout.
	var after int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&after); err != nil {
		return nil, err
	}
	if after != pid {
		return nil, fmt.Errorf("the traced connection was replaced (backend %d, then %d)", pid, after)
	}
	return rep, nil
}

// profileRows averages trips by label, in the order they first appeared.
func profileRows(trips []profileTrip, n int) []profileRow {
	type acc struct {
		count        int
		server, wall time.Duration
		unmeasured   bool
	}
	var order []string
	sums := map[string]*acc{}
	for _, t := range trips {
		a := sums[t.label]
		if a == nil {
			a = &acc{}
			sums[t.label] = a
			order = append(order, t.label)
		}
		a.count++
		a.wall += t.wall
		if t.server < 0 {
			a.unmeasured = true
		}
		a.server += t.server
	}
	var rows []profileRow
	for _, l := range order {
		a := sums[l]
		r := profileRow{Label: l, PerRequest: float64(a.count) / float64(n), Server: a.server / time.Duration(a.count), Wall: a.wall / time.Duration(a.count)}
		if a.unmeasured {
			r.Server = -1
		}
		rows = append(rows, r)
	}
	return rows
}
