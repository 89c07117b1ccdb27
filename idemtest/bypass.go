package idemtest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// BypassCheck configures the kit's check for writes that bypass the phase's
// transaction: a statement a phase sends through the pool (or a *db.Queries
// built on it) instead of its tx. Such a write commits on its own, so it
// survives the phase's rollback and happens again when the phase re-runs,
// and nothing about the key shows it.
//
// How it works: in every crash_before_commit scenario, the kit notes
// Postgres's next transaction id when the phase's transaction begins, and
// again around the phase's foreign call. The worker then dies before the
// commit, so everything the phase wrote through its tx rolls back. Any row
// still visible in a watched table whose xmin (the id of the transaction
// that wrote it) was handed out after the phase began, and not during its
// foreign call, was written by another transaction while the phase ran: the
// scenario fails, naming the table and the row count.
//
// It sees inserts and updates, not deletes. Writes during the foreign call
// are left out, because a fake provider may keep its state in the same
// database. Any other transaction writing to a watched table while the
// phase runs is reported too: give each test a schema of its own
// (NewSchema), and list tables that something else writes to concurrently
// (a River client's, say) in Ignore.
type BypassCheck struct {
	// Off turns the check off.
	Off bool
	// Tables are the tables to watch, as SQL names (schema-qualified, or
	// found through the search_path of Pool's connections). Empty: every
	// ordinary table in the schemas on that search_path, except idem's
	// own (idem_keys, idem_leases, idem_migrations).
	Tables []string
	// Ignore lists tables not to watch, spelled as in Tables.
	Ignore []string
}

// bypassWatch is one scenario's watch over its faulted phase, whose
// transaction never commits: the transaction-id marks taken while the phase
// ran.
type bypassWatch struct {
	x interface {
		watchDB() queryRower
		bypassConfig() BypassCheck
	}
	mu      sync.Mutex
	start   uint32 // first xid handed out after the phase's transaction began
	started bool
	// end is the first xid not yet handed out when the fault struck: what
	// runs after it (a re-run, a retry) is not the faulted phase's.
	end   uint32
	ended bool
	// foreign are the [from, to) ranges of xids handed out during the
	// phase's foreign calls.
	foreign  [][2]uint32
	openCall uint32
	inCall   bool
	err      error
}

type queryRower interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func (x *explorer[In]) watchDB() queryRower       { return x.db }
func (x *explorer[In]) bypassConfig() BypassCheck { return x.cfg.Bypass }

// newBypassWatch returns the watch for a scenario of kind, or nil
// when the check does not apply to it. It applies where the faulted phase's
// transaction never commits: crash_before_commit.
func (x *explorer[In]) newBypassWatch(kind Kind) *bypassWatch {
	if x.cfg.Bypass.Off {
		return nil
	}
	if kind != CrashBeforeCommit {
		return nil
	}
	return &bypassWatch{x: x}
}

// nextXID is the first transaction id not yet handed out. Reading it
// assigns none.
func nextXID(ctx context.Context, db queryRower) (uint32, error) {
	var s string
	if err := db.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text`).Scan(&s); err != nil {
		return 0, fmt.Errorf("idemtest: read the next transaction id: %w", err)
	}
	full, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("idemtest: read the next transaction id: %w", err)
	}
	return uint32(full), nil // xmin carries the low 32 bits
}

// note records a mark at a hook point of the faulted phase. It runs on the
// worker's goroutine, inside the phase.
func (b *bypassWatch) note(ctx context.Context, where HookWhere) {
	if b == nil {
		return
	}
	switch where {
	case HookPhaseStart, HookBeforeForeign, HookAfterForeign:
	default:
		return
	}
	b.mark(ctx, func(xid uint32) {
		switch where {
		case HookPhaseStart:
			if !b.started {
				b.start, b.started = xid, true
			}
		case HookBeforeForeign:
			b.openCall, b.inCall = xid, true
		case HookAfterForeign:
			if b.inCall {
				b.foreign = append(b.foreign, [2]uint32{b.openCall, xid})
				b.inCall = false
			}
		}
	})
}

// strike records the end mark as the fault strikes, on the worker's
// goroutine, before the phase's transaction ends.
func (b *bypassWatch) strike(ctx context.Context) {
	if b == nil {
		return
	}
	b.mark(ctx, func(xid uint32) { b.end, b.ended = xid, true })
}

// mark reads the next transaction id and hands it to set under b.mu, or
// keeps the error for check.
func (b *bypassWatch) mark(ctx context.Context, set func(xid uint32)) {
	xid, err := nextXID(context.WithoutCancel(ctx), b.x.watchDB())
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		b.err = err
		return
	}
	set(xid)
}

// check runs once the faulted phase's transaction has ended without
// committing: it reports rows in the watched tables that transactions other
// than the phase's wrote while it ran.
func (b *bypassWatch) check(ctx context.Context, sc *scenario, phase string) {
	if b == nil {
		return
	}
	b.mu.Lock()
	started, start, foreign, inCall, openCall, err := b.started, b.start, slices.Clone(b.foreign), b.inCall, b.openCall, b.err
	end, ended := b.end, b.ended
	b.mu.Unlock()
	if err == nil && !started {
		return // the fault never came to this phase; reported elsewhere
	}
	db := b.x.watchDB()
	if err == nil && !ended {
		end, err = nextXID(ctx, db)
	}
	if inCall { // the call never returned: its range runs to the end
		foreign = append(foreign, [2]uint32{openCall, end})
	}
	var tables []string
	if err == nil {
		tables, err = watchedTables(ctx, db, b.x.bypassConfig())
	}
	if err != nil {
		sc.violate("idemtest could not check for writes that bypass the phase's transaction (set Config.Bypass.Off to skip the check): %v", err)
		return
	}
	for _, table := range tables {
		n, err := rowsWrittenBetween(ctx, db, table, start, end, foreign)
		if err != nil {
			sc.violate("idemtest could not check table %s for writes that bypass the phase's transaction (list it in Config.Bypass.Ignore, or set Config.Bypass.Off): %v", table, err)
			continue
		}
		if n > 0 {
			sc.violate("phase %q wrote %d row(s) to %s through a connection other than its transaction: the worker died before the commit, the phase's transaction rolled back, and these rows stayed, so the re-run writes them again. "+
				"Send every statement through the phase's tx (with sqlc, db.New(tx)), never the pool; if something else writes to %s while flows run, list it in Config.Bypass.Ignore",
				phase, n, table, table)
		}
	}
}

// watchedTables resolves the check's tables to quoted, schema-qualified
// names.
func watchedTables(ctx context.Context, db queryRower, cfg BypassCheck) ([]string, error) {
	resolve := func(names []string) ([]string, error) {
		out := make([]string, 0, len(names))
		for _, name := range names {
			var q string
			err := db.QueryRow(ctx, `SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)`, name).Scan(&q)
			if err != nil {
				return nil, fmt.Errorf("table %q: %w", name, err)
			}
			out = append(out, q)
		}
		return out, nil
	}
	ignore, err := resolve(cfg.Ignore)
	if err != nil {
		return nil, err
	}
	var tables []string
	if len(cfg.Tables) > 0 {
		if tables, err = resolve(cfg.Tables); err != nil {
			return nil, err
		}
	} else {
		rows, err := db.Query(ctx, `
			SELECT format('%I.%I', n.nspname, c.relname)
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE c.relkind = 'r' AND n.nspname = ANY (current_schemas(false))
			  AND c.relname NOT IN ('idem_keys', 'idem_leases', 'idem_migrations')
			ORDER BY 1`)
		if err != nil {
			return nil, err
		}
		if tables, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return nil, err
		}
	}
	return slices.DeleteFunc(tables, func(t string) bool { return slices.Contains(ignore, t) }), nil
}

// rowsWrittenBetween counts the rows of table whose xmin lies in [from, to)
// and outside every skip range, in xid arithmetic modulo 2^32.
func rowsWrittenBetween(ctx context.Context, db queryRower, table string, from, to uint32, skip [][2]uint32) (int64, error) {
	// The distance of xmin past from, wrapping around.
	const dist = `((xmin::text::bigint - %d + 4294967296) %% 4294967296)`
	var cond strings.Builder
	fmt.Fprintf(&cond, dist+" < %d", from, int64(to-from))
	for _, s := range skip {
		fmt.Fprintf(&cond, " AND NOT ("+dist+" < %d)", s[0], int64(s[1]-s[0]))
	}
	var n int64
	err := db.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE "+cond.String()).Scan(&n)
	return n, err
}
