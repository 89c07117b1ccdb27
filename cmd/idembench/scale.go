package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/migrations"
	"github.com/go-idem/idem/pgstore"
)

// scaleConfig sizes the scale measurement.
type scaleConfig struct {
	Small, Large int // rows in the keys table for the two measurements
	Expired      int // rows among Large that the reaper deletes
	Concurrency  int
	Duration     time.Duration
	ReapTimeout  time.Duration
	Steady       steadyConfig
}

// scalePoint is one measurement of acquisitions: half the workers acquire
// new keys (an insert into the big table and its indexes), half replay
// existing finished keys (an index lookup and a heap fetch).
type scalePoint struct {
	Label    string
	Rows     int64 // rows in the table when the measurement started (after the warm-up)
	Warmup   *warmup
	New      *stats
	Replay   *stats
	Took     time.Duration // generating the rows, for the size points
	Reaped   int
	Batches  int
	ReapTook time.Duration
}

type scaleReport struct {
	Config    scaleConfig
	Points    []*scalePoint // 10k, 10M, 10M while reaping
	TableSize string
	GenSteps  []string // what generating the large table spent its time on
	// NoPrewarm says why pg_prewarm was not used, when it was not.
	NoPrewarm string
}

// measureScale grows one keys table of its own from Small to Large rows and
// measures acquisitions at each size, then again while the reaper deletes
// the Expired rows.
func measureScale(ctx context.Context, e *env, cfg scaleConfig, logf func(string, ...any)) (*scaleReport, error) {
	schema := e.schema + "_scale"
	quoted := pgx.Identifier{schema}.Sanitize()
	if _, err := e.pool.Exec(ctx, "CREATE SCHEMA "+quoted); err != nil {
		return nil, err
	}
	defer func() {
		// Dropping ten million rows is quick (files are unlinked), but do
		// it here so a DATABASE_URL run leaves nothing behind even if the
		// whole schema drop later fails.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		_, _ = e.pool.Exec(dctx, "DROP SCHEMA IF EXISTS "+quoted+" CASCADE")
	}()
	m, err := migrations.New(e.pool, &migrations.Config{Schema: schema})
	if err != nil {
		return nil, err
	}
	if _, err := m.Up(ctx); err != nil {
		return nil, fmt.Errorf("migrate the scale schema: %w", err)
	}
	table := quoted + ".idem_keys"
	runner, store, err := newRunner(e.pool, schema, idem.Config{})
	if err != nil {
		return nil, err
	}
	defer store.Close()
	// The bulk load runs on a pool of its own: a connection of e.pool that
	// the store ran a phase on keeps the phase statement timeout for its
	// session (pgstore sets it once per connection), which would cancel the
	// load's long statements.
	bulk, err := e.newPool(ctx, 2, nil)
	if err != nil {
		return nil, err
	}
	defer bulk.Close()
	rep := &scaleReport{Config: cfg}
	pw, err := newPrewarmer(ctx, e)
	if err != nil {
		return nil, err
	}
	rep.NoPrewarm = pw.why
	if pw.why != "" {
		logf("idembench: pg_prewarm is not available (%s); prewarming with SELECTs", pw.why)
	}

	// The expired rows are the oldest: right after the small table's.
	expiredFrom, expiredTo := int64(cfg.Small)+1, int64(cfg.Small+cfg.Expired)

	started := time.Now()
	if err := generateKeys(ctx, bulk, table, 1, int64(cfg.Small), expiredFrom, expiredTo, logf); err != nil {
		return nil, err
	}
	if _, err := bulk.Exec(ctx, "VACUUM (ANALYZE) "+table); err != nil {
		return nil, err
	}
	smallTook := time.Since(started)
	settle(ctx, e, logf)
	small, err := measurePoint(ctx, e, store, pw, table, cfg, "small", nil, logf)
	if err != nil {
		return nil, err
	}
	small.Took = smallTook
	small.Label = fmt.Sprintf("%s rows", humanCount(cfg.Small))
	rep.Points = append(rep.Points, small)

	took, steps, err := growKeys(ctx, bulk, table, int64(cfg.Small)+1, int64(cfg.Large), expiredFrom, expiredTo, logf)
	if err != nil {
		return nil, err
	}
	rep.GenSteps = steps
	settled := settle(ctx, e, logf)
	what := "checkpoint"
	if e.local {
		what = "checkpoint and sync(2)"
	}
	rep.GenSteps = append(rep.GenSteps, fmt.Sprintf("%s: %s", what, settled.Round(100*time.Millisecond)))
	large, err := measurePoint(ctx, e, store, pw, table, cfg, "large", nil, logf)
	if err != nil {
		return nil, err
	}
	large.Took = took
	large.Label = fmt.Sprintf("%s rows", humanCount(cfg.Large))
	rep.Points = append(rep.Points, large)
	// The sizes say what a cache must hold: the heap and each index.
	if err := e.pool.QueryRow(ctx, `
		SELECT pg_size_pretty(pg_total_relation_size($1::regclass)) || ' (heap ' || pg_size_pretty(pg_relation_size($1::regclass)) || ', ' ||
		       (SELECT string_agg(c.relname || ' ' || pg_size_pretty(pg_relation_size(i.indexrelid)), ', ' ORDER BY c.relname)
		        FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = $1::regclass) || ')'`,
		table).Scan(&rep.TableSize); err != nil {
		return nil, err
	}

	// Warm up again without the reaper, then reap the expired rows while
	// acquisitions run, and measure those acquisitions for exactly as long
	// as the reaper works.
	var (
		reaped  *idem.ReapResult
		reapErr error
		reapDur time.Duration
	)
	startReaper := func() <-chan struct{} {
		logf("idembench: reaping %d expired keys under load", cfg.Expired)
		done := make(chan struct{})
		go func() {
			defer close(done)
			reapCtx, cancelReap := context.WithTimeout(ctx, cfg.ReapTimeout)
			defer cancelReap()
			began := time.Now()
			reaped, reapErr = runner.Reap(reapCtx, nil)
			reapDur = time.Since(began)
		}()
		return done
	}
	during, err := measurePoint(ctx, e, store, pw, table, cfg, "reap", startReaper, logf)
	if err != nil {
		return nil, err
	}
	if reapErr != nil && !errors.Is(reapErr, context.DeadlineExceeded) {
		return nil, fmt.Errorf("reap: %w", reapErr)
	}
	during.Label = fmt.Sprintf("%s rows, reaper deleting %s", humanCount(cfg.Large), humanCount(cfg.Expired))
	if reaped != nil {
		during.Reaped, during.Batches = reaped.Deleted, reaped.Batches
	}
	during.ReapTook = reapDur
	rep.Points = append(rep.Points, during)
	return rep, nil
}

// generateKeys inserts finished keys numbered from..to: log-uniform scopes
// over a million users (a few tenants with very many keys, a long tail with
// few), random UUID keys, a response and checkpoint of realistic size, and
// finish times over the last 20 hours; keys numbered within
// expiredFrom..expiredTo finished 25 hours ago and have expired. Chunks of
// half a million rows are inserted by two connections at once.
func generateKeys(ctx context.Context, db *pgxpool.Pool, table string, from, to, expiredFrom, expiredTo int64, logf func(string, ...any)) error {
	// One md5 per row feeds the key (as a UUID), the scope (its last 32
	// bits), the fingerprint and the charge id.
	const sql = `
INSERT INTO %s (scope, key, flow, method, path, fingerprint, params, status, recovery_point, checkpoint,
                response_status, response_headers, response_body, created_at, reap_after, last_run_at, finished_at, expires_at)
SELECT 'user:' || floor(exp(13.815510557964274 * (('x' || substr(r.h, 25, 8))::bit(32)::bigint / 4294967296.0)))::bigint,
       r.h::uuid::text,
       'bench.rides', 'POST', '/rides',
       '\x02'::bytea || decode(r.h || r.h, 'hex'),
       jsonb_build_object('user_id', i %% 1000000, 'origin', 'SF', 'amount', 2000),
       'finished', 'finished',
       jsonb_build_object('ride_id', i, 'charge_id', 'ch_' || left(r.h, 24)),
       201, '{"Content-Type": ["application/json"]}',
       convert_to('{"ride_id":' || i || ',"charge_id":"ch_' || left(r.h, 24) || '","amount":2000}', 'UTF8'),
       t.f - interval '40 milliseconds', t.f - interval '40 milliseconds' + interval '24 hours', t.f, t.f, t.f + interval '24 hours'
FROM generate_series($1::bigint, $2::bigint) AS i
CROSS JOIN LATERAL (SELECT md5(i::text || ':idembench') AS h) AS r
CROSS JOIN LATERAL (SELECT CASE WHEN i BETWEEN $3 AND $4
                                THEN now() - interval '25 hours' - (i %% 3600) * interval '1 second'
                                ELSE now() - (i %% 72000) * interval '1 second' END AS f) AS t`
	const chunk = 500_000
	n := int((to - from + chunk) / chunk)
	return forEach(ctx, 2, n, func(ctx context.Context, c int) error {
		lo := from + int64(c)*chunk
		hi := min(lo+chunk-1, to)
		began := time.Now()
		if _, err := db.Exec(ctx, fmt.Sprintf(sql, table), lo, hi, expiredFrom, expiredTo); err != nil {
			return fmt.Errorf("generate keys %d-%d: %w", lo, hi, err)
		}
		if n > 1 {
			logf("idembench: generated keys %d-%d in %s", lo, hi, time.Since(began).Round(time.Millisecond))
		}
		return nil
	})
}

// growKeys adds keys from..to the way a bulk load is done: the secondary
// indexes are dropped, the rows inserted, and the indexes built again from
// their own definitions; then VACUUM ANALYZE, as autovacuum would have done
// to a table that grew over months. It returns the time it all took.
func growKeys(ctx context.Context, db *pgxpool.Pool, table string, from, to, expiredFrom, expiredTo int64, logf func(string, ...any)) (time.Duration, []string, error) {
	began := time.Now()
	var steps []string
	step := func(what string, since time.Time) {
		d := time.Since(since).Round(100 * time.Millisecond)
		steps = append(steps, fmt.Sprintf("%s: %s", what, d))
		logf("idembench: %s in %s", what, d)
	}
	conn, err := db.Acquire(ctx)
	if err != nil {
		return 0, nil, err
	}
	defer conn.Release()
	for _, set := range []string{"SET maintenance_work_mem = '1GB'", "SET max_parallel_maintenance_workers = 2"} {
		if _, err := conn.Exec(ctx, set); err != nil {
			return 0, nil, err
		}
	}
	// What to rebuild: the unique constraint on (scope, key) and every
	// other index except the primary key (appended to in order, cheap).
	type rebuild struct{ name, drop, create string }
	var rebuilds []rebuild
	rows, err := conn.Query(ctx, `
		SELECT c.conname::text,
		       'ALTER TABLE ' || $1 || ' DROP CONSTRAINT ' || quote_ident(c.conname),
		       'ALTER TABLE ' || $1 || ' ADD CONSTRAINT ' || quote_ident(c.conname) || ' ' || pg_get_constraintdef(c.oid)
		FROM pg_constraint c WHERE c.conrelid = $1::regclass AND c.contype = 'u'
		UNION ALL
		SELECT (SELECT relname::text FROM pg_class WHERE oid = i.indexrelid),
		       'DROP INDEX ' || i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
		FROM pg_index i
		WHERE i.indrelid = $1::regclass AND NOT i.indisprimary
		  AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)`, table)
	if err != nil {
		return 0, nil, err
	}
	for rows.Next() {
		var r rebuild
		if err := rows.Scan(&r.name, &r.drop, &r.create); err != nil {
			return 0, nil, err
		}
		rebuilds = append(rebuilds, r)
	}
	if err := rows.Err(); err != nil {
		return 0, nil, err
	}
	for _, r := range rebuilds {
		if _, err := conn.Exec(ctx, r.drop); err != nil {
			return 0, nil, fmt.Errorf("%s: %w", r.drop, err)
		}
	}
	t := time.Now()
	if err := generateKeys(ctx, db, table, from, to, expiredFrom, expiredTo, logf); err != nil {
		return 0, nil, err
	}
	step(fmt.Sprintf("insert %s rows", humanCount(int(to-from+1))), t)
	// Every key loaded is finished: the sweep's cursor goes past them, as
	// the migration puts it past the keys it finds, rather than make the
	// first operations that look for unfinished keys read them all.
	sweep := strings.TrimSuffix(table, "idem_keys") + "idem_sweep"
	if _, err := conn.Exec(ctx, `UPDATE `+sweep+` SET swept_id = m.id, ready_id = m.id, next_id = m.id,
		next_xid = pg_snapshot_xmax(pg_current_snapshot())::text::bigint, next_at = now()
		FROM (SELECT max(id) AS id FROM `+table+`) m`); err != nil {
		return 0, nil, fmt.Errorf("move the sweep's cursor past the loaded keys: %w", err)
	}
	for _, r := range rebuilds {
		t := time.Now()
		if _, err := conn.Exec(ctx, r.create); err != nil {
			return 0, nil, fmt.Errorf("%s: %w", r.create, err)
		}
		step("build "+r.name, t)
	}
	t = time.Now()
	if _, err := conn.Exec(ctx, "VACUUM (ANALYZE) "+table); err != nil {
		return 0, nil, err
	}
	step("VACUUM (ANALYZE)", t)
	return time.Since(began), steps, nil
}

// replayTarget is an existing finished key, with what a replay sends.
type replayTarget struct {
	scope, key  string
	fingerprint []byte
	params      []byte
}

// measurePoint measures acquisitions on table in steady state: it
// prewarms the table and its indexes, runs the workload in windows until
// its throughput stops rising, and then measures cfg.Concurrency workers
// for cfg.Duration: the first half acquire new keys, the second half replay
// a random sample of unexpired finished keys. With background not nil, the
// measurement starts what it returns (the reaper) after the warm-up and
// lasts until that is done.
func measurePoint(ctx context.Context, e *env, store *pgstore.Store, pw *prewarmer, table string, cfg scaleConfig, tag string,
	background func() <-chan struct{}, logf func(string, ...any)) (*scalePoint, error) {
	var rowCount int64
	if err := e.pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&rowCount); err != nil {
		return nil, err
	}
	// A sample spread over the whole table (SYSTEM samples pages), so
	// replays touch cold pages as real retries of old keys would.
	pct := math.Min(100, 20_000*100/float64(max(rowCount, 1)))
	rows, err := e.pool.Query(ctx, fmt.Sprintf(`
		SELECT scope, key, fingerprint, params::text FROM %s TABLESAMPLE SYSTEM (%g)
		WHERE status = 'finished' AND expires_at > now() + interval '1 hour' LIMIT 20000`, table, pct))
	if err != nil {
		return nil, err
	}
	var targets []replayTarget
	for rows.Next() {
		var t replayTarget
		var params string
		if err := rows.Scan(&t.scope, &t.key, &t.fingerprint, &params); err != nil {
			return nil, err
		}
		t.params = []byte(params)
		targets = append(targets, t)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(targets) == 0 {
		return nil, errors.New("no finished keys to replay")
	}
	// A fingerprint of a new key's shape (the store compares it, nothing
	// more): the scheme byte and a hash.
	sum := sha256.Sum256([]byte(flowName + "\x00\x00j" + `{"amount":2000,"origin":"SF","user_id":7}`))
	newFP := append([]byte{2}, sum[:]...)
	conc := max(cfg.Concurrency, 2)
	half := max(conc/2, 1)
	run := randomHex(4)
	var seq, created atomic.Int64
	acquire := func(ctx context.Context, w, i int) error {
		p := idemdriver.AcquireParams{Flow: flowName, Method: "POST", Path: "/rides", Lease: 90 * time.Second, Retention: 24 * time.Hour}
		want := idemdriver.AcquiredNone
		if w < half {
			u := rand.Float64()
			p.Scope = "user:" + strconv.Itoa(int(math.Exp(13.815510557964274*u)))
			p.Key = "scale-" + tag + "-" + run + "-" + strconv.FormatInt(seq.Add(1), 10)
			p.Fingerprints, p.Params = [][]byte{newFP}, []byte(`{"amount":2000,"origin":"SF","user_id":7}`)
			want = idemdriver.AcquiredCreated
		} else {
			t := targets[rand.IntN(len(targets))]
			p.Scope, p.Key, p.Fingerprints, p.Params = t.scope, t.key, [][]byte{t.fingerprint}, t.params
		}
		res, err := store.Acquire(ctx, p)
		if err != nil {
			return err
		}
		if res.Acquired != want || (want == idemdriver.AcquiredNone && res.Record.Status != idemtype.StoredFinished) {
			return fmt.Errorf("acquire %s/%s: %s (%s), want %s", p.Scope, p.Key, res.Acquired, res.Record.Status, want)
		}
		if want == idemdriver.AcquiredCreated {
			created.Add(1)
		}
		return nil
	}

	what, prewarmTook, err := pw.warm(ctx, e, table)
	if err != nil {
		return nil, err
	}
	warm, err := runWindows(ctx, conc, cfg.Steady, acquire)
	if err != nil {
		return nil, err
	}
	warm.Prewarm, warm.PrewarmTook = what, prewarmTook
	state := "steady"
	if !warm.Steady {
		state = "not steady"
	}
	logf("idembench: %s: prewarmed in %s, %s after %d windows in %s: %s/s", tag, shortDuration(prewarmTook),
		state, len(warm.Windows), shortDuration(warm.Took), windowsText(warm.Windows))

	pt := &scalePoint{Rows: rowCount + created.Load(), Warmup: warm}
	d, stop := cfg.Duration, (<-chan struct{})(nil)
	if background != nil {
		stop = background()
		d = cfg.ReapTimeout
	}
	lats, window, err := drive(ctx, conc, 0, d, stop, acquire)
	if stop != nil {
		<-stop
	}
	if err != nil {
		return nil, err
	}
	var newLat, replayLat []time.Duration
	for w, l := range lats {
		if w < half {
			newLat = append(newLat, l...)
		} else {
			replayLat = append(replayLat, l...)
		}
	}
	pt.New, pt.Replay = newStats(newLat, window), newStats(replayLat, window)
	return pt, nil
}

func humanCount(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1_000_000:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return strconv.Itoa(n)
}

// settle writes out what generating rows left dirty before a point is
// measured, so the point does not pay for the bulk load's writes: a
// CHECKPOINT (a superuser's right; elsewhere the warm-up has to absorb the
// dirty buffers) and, when the server shares this machine's kernel, a
// sync(2). The throwaway cluster runs with fsync off, so without the sync
// the kernel flushes gigabytes of the load's pages during the measurement
// and throttles every backend that writes meanwhile.
func settle(ctx context.Context, e *env, logf func(string, ...any)) time.Duration {
	began := time.Now()
	_, _ = e.pool.Exec(ctx, "CHECKPOINT")
	if e.local {
		syscall.Sync()
	}
	took := time.Since(began)
	logf("idembench: checkpoint and sync in %s", took.Round(100*time.Millisecond))
	return took
}
