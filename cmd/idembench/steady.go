package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// A scale point is measured in steady state: after its table and indexes
// are prewarmed, and after the workload has run in windows until its
// throughput stops rising. Without that, the first point after a bulk load
// measures a cold cache rather than the table's size.

// steadyRule says when throughput has stopped rising: when a window is not
// more than rise above the best window before it, calm times in a row.
type steadyRule struct {
	rise  float64 // 0.03: three percent
	calm  int     // windows in a row
	best  float64
	quiet int
	n     int
}

// add takes the next window's throughput and tells whether the workload
// is now steady.
func (r *steadyRule) add(throughput float64) bool {
	if r.n > 0 && throughput <= r.best*(1+r.rise) {
		r.quiet++
	} else {
		r.quiet = 0
	}
	r.n++
	r.best = max(r.best, throughput)
	return r.quiet >= r.calm
}

// steadyConfig is how long a scale point warms up.
type steadyConfig struct {
	Window     time.Duration // one window
	MaxWindows int           // give up on a steady state after this many
}

const (
	steadyRise = 0.03
	steadyCalm = 2
)

// warmup is how one point warmed up.
type warmup struct {
	Prewarm     string        // what was prewarmed, and how
	PrewarmTook time.Duration // prewarming
	Windows     []float64     // each window's throughput (operations/s)
	Took        time.Duration // the windows
	Steady      bool          // false: the windows ran out first
}

// runWindows runs fn on conc workers in windows of cfg.Window until the
// throughput stops rising (steadyRule), at most cfg.MaxWindows windows.
func runWindows(ctx context.Context, conc int, cfg steadyConfig, fn op) (*warmup, error) {
	w := &warmup{}
	rule := &steadyRule{rise: steadyRise, calm: steadyCalm}
	began := time.Now()
	for len(w.Windows) < cfg.MaxWindows {
		s, err := closedLoop(ctx, conc, 0, cfg.Window, fn)
		if err != nil {
			return nil, err
		}
		w.Windows = append(w.Windows, s.Throughput())
		if rule.add(s.Throughput()) {
			w.Steady = true
			break
		}
	}
	w.Took = time.Since(began)
	return w, nil
}

// prewarmer pulls a table and its indexes into the caches before a point.
type prewarmer struct {
	// fn is pg_prewarm, qualified with its schema; empty when the
	// extension is not available, and why says why.
	fn  string
	why string
	// sharedBuffers is the server's buffer cache in bytes.
	sharedBuffers int64
}

// newPrewarmer creates the pg_prewarm extension in the run's database if it
// is not there yet (the run's schema, dropped with it), and finds it.
func newPrewarmer(ctx context.Context, e *env) (*prewarmer, error) {
	pw := &prewarmer{}
	if err := e.pool.QueryRow(ctx, "SELECT pg_size_bytes(current_setting('shared_buffers'))").Scan(&pw.sharedBuffers); err != nil {
		return nil, err
	}
	if _, err := e.pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_prewarm"); err != nil {
		pw.why = err.Error()
		return pw, nil
	}
	var schema string
	if err := e.pool.QueryRow(ctx, `
		SELECT quote_ident(n.nspname) FROM pg_extension x JOIN pg_namespace n ON n.oid = x.extnamespace
		WHERE x.extname = 'pg_prewarm'`).Scan(&schema); err != nil {
		return nil, err
	}
	pw.fn = schema + ".pg_prewarm"
	return pw, nil
}

// relation is one relation of a table, to prewarm.
type relation struct {
	name    string // regclass text
	size    int64  // bytes
	index   bool
	unique  bool
	columns string // an index's columns, for the fallback's ORDER BY
	where   string // a partial index's predicate
}

// warm prewarms table and its indexes and says how. With pg_prewarm the
// indexes go first (every acquisition probes the unique one), each into
// shared_buffers ('buffer') while they fit in three quarters of it, the
// rest into the operating system's page cache ('read'). Without it, it
// reads every page with SELECTs: the heap by a sequential scan, each index
// by a full index scan.
func (pw *prewarmer) warm(ctx context.Context, e *env, table string) (string, time.Duration, error) {
	began := time.Now()
	rels, err := tableRelations(ctx, e, table)
	if err != nil {
		return "", 0, err
	}
	if pw.fn == "" {
		if err := readEveryPage(ctx, e, table, rels); err != nil {
			return "", 0, err
		}
		var total int64
		for _, r := range rels {
			total += r.size
		}
		return fmt.Sprintf("SELECTs read %d relations (%s)", len(rels), bytesText(total)), time.Since(began), nil
	}
	budget := pw.sharedBuffers * 3 / 4
	var buffered, read []string
	var inBuffers, inCache int64
	for _, r := range rels {
		mode := "read"
		if r.size <= budget {
			mode = "buffer"
			budget -= r.size
		}
		if _, err := e.pool.Exec(ctx, "SELECT "+pw.fn+"($1::regclass, $2)", r.name, mode); err != nil {
			return "", 0, fmt.Errorf("pg_prewarm %s (%s): %w", r.name, mode, err)
		}
		if mode == "buffer" {
			buffered = append(buffered, shortName(r.name))
			inBuffers += r.size
		} else {
			read = append(read, shortName(r.name))
			inCache += r.size
		}
	}
	var parts []string
	switch {
	case len(read) == 0:
		parts = append(parts, fmt.Sprintf("'buffer' all %d relations (%s)", len(buffered), bytesText(inBuffers)))
	case len(buffered) > 0:
		parts = append(parts, fmt.Sprintf("'buffer' %s (%s)", strings.Join(buffered, ", "), bytesText(inBuffers)))
		fallthrough
	default:
		parts = append(parts, fmt.Sprintf("'read' %s (%s)", strings.Join(read, ", "), bytesText(inCache)))
	}
	return "pg_prewarm " + strings.Join(parts, "; "), time.Since(began), nil
}

// tableRelations lists table's indexes (the unique ones first, then by
// size) and then its heap.
func tableRelations(ctx context.Context, e *env, table string) ([]relation, error) {
	rows, err := e.pool.Query(ctx, `
		SELECT i.indexrelid::regclass::text, pg_relation_size(i.indexrelid), true, i.indisunique,
		       (SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY k.n)
		        FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
		        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum),
		       coalesce(pg_get_expr(i.indpred, i.indrelid), '')
		FROM pg_index i WHERE i.indrelid = $1::regclass
		UNION ALL
		SELECT $1::regclass::text, pg_relation_size($1::regclass), false, false, '', ''`, table)
	if err != nil {
		return nil, err
	}
	rels, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (relation, error) {
		var r relation
		var columns *string
		err := row.Scan(&r.name, &r.size, &r.index, &r.unique, &columns, &r.where)
		if columns != nil {
			r.columns = *columns
		}
		return r, err
	})
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(rels, func(a, b relation) int {
		rank := func(r relation) int {
			switch {
			case r.index && r.unique:
				return 0
			case r.index:
				return 1
			}
			return 2
		}
		if d := rank(a) - rank(b); d != 0 {
			return d
		}
		switch {
		case a.size < b.size:
			return -1
		case a.size > b.size:
			return 1
		}
		return 0
	})
	return rels, nil
}

// readEveryPage is the fallback without pg_prewarm: a sequential scan of
// the heap, and a full scan of each index in its order (sequential scans,
// bitmap scans and sorts disabled, so the planner walks the index).
func readEveryPage(ctx context.Context, e *env, table string, rels []relation) error {
	return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		var n int64
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			return fmt.Errorf("read every page of %s: %w", table, err)
		}
		for _, set := range []string{"SET LOCAL enable_seqscan = off", "SET LOCAL enable_bitmapscan = off", "SET LOCAL enable_sort = off"} {
			if _, err := tx.Exec(ctx, set); err != nil {
				return err
			}
		}
		for _, r := range rels {
			if !r.index || r.columns == "" {
				continue // the heap, read above; or an expression index
			}
			where := ""
			if r.where != "" {
				where = " WHERE " + r.where
			}
			sql := "SELECT count(*) FROM (SELECT 1 FROM " + table + where + " ORDER BY " + r.columns + ") AS s"
			if err := tx.QueryRow(ctx, sql).Scan(&n); err != nil {
				return fmt.Errorf("read every page of %s: %w", r.name, err)
			}
		}
		return nil
	})
}

// shortName drops a relation name's schema.
func shortName(name string) string {
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		return name[i+1:]
	}
	return name
}

func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.0f kB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// shortDuration prints d to a tenth of a second, or in milliseconds below
// a second.
func shortDuration(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

// windowsText is a warm-up's windows, compactly: "4.1k 5.0k 5.2k".
func windowsText(tps []float64) string {
	parts := make([]string, len(tps))
	for i, tp := range tps {
		if tp >= 1000 {
			parts[i] = fmt.Sprintf("%.1fk", tp/1000)
		} else {
			parts[i] = fmt.Sprintf("%.0f", tp)
		}
	}
	return strings.Join(parts, " ")
}
