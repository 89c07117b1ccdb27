package pgstore

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
)

// How the operations find unfinished keys without an index on status.
//
// No index on idem_keys names a column a phase commit or the finish writes,
// so that both are HOT updates (a new tuple on the same page, no index
// entry). An index on status, or a partial index on unfinished rows, would
// take an entry at every finish. Instead the unfinished keys are:
//
//   - the keys with an id past the sweep's cursor (idem_sweep.swept_id):
//     about the keys created since the last two operations that looked
//     for unfinished keys (the cursor moves in two stages, below), found
//     by the id index;
//   - the stragglers (idem_stragglers): keys that were still unfinished when
//     the sweep's cursor passed them, a few (a request running for minutes,
//     a key parked for reconciliation, a key nobody has resumed yet).
//
// The sweep moves the cursor in two stages, each once no session of the
// database holds a snapshot or a transaction id as old as the last move
// (pg_stat_activity's backend_xmin and backend_xid, which every role may
// read; see queries.sweepClaim): the highest id a move saw becomes ready at
// the next, when every insert that took an id up to it has ended its
// statement, and the cursor reaches it at the one after, when every such
// insert has also committed or failed. An insert takes its id (nextval)
// after its statement began and keeps its statement's snapshot until the
// statement ends, however long it waits for a lock, so the cursor never
// passes a key still on its way. No clock is trusted. (It also counts on
// ids handed out in the order inserts ask for them: the identity sequence
// has a cache of 1, its default; a larger cache would hand a session ids
// minutes after another took higher ones.) A session that keeps an old
// snapshot for long (a long report, a transaction left open) holds the
// cursor back, and the window grows until it ends; so does an operation
// that is not called, as the cursor moves only when one looks for
// unfinished keys, at most once per sweepLag. The same sweep forgets
// stragglers that have finished. A sweep far behind lists sweepChunk keys
// per transaction.
//
// Whoever reads the unfinished keys (completer, reaper of unfinished keys,
// backlog, listings by state) sweeps first when the sweep is due, then
// reads the cursor and the stragglers' ids, and passes both to its
// statement, which reads (k.id > cursor OR k.id = ANY(stragglers)) through
// idem_keys_id and re-checks the status. A cursor read before another
// process moves it on is only a wider window.

// sweepLag is the least time between two moves of the sweep's cursor.
const sweepLag = time.Second

// unfinishedWindow is where the unfinished keys are: ids past swept, and
// the stragglers.
type unfinishedWindow struct {
	swept      int64
	stragglers []int64
}

// args are the two parameters unfinishedAmong names.
func (w unfinishedWindow) args() []any { return []any{w.swept, w.stragglers} }

// unfinishedAmong is the condition that k is unfinished, read through the
// unfinished window passed as parameters $swept (bigint) and $stragglers
// (bigint[]): two ranges of idem_keys_id (a BitmapOr), never the finished
// millions. "status <> 'finished'" is also the predicate of the Citus
// layout's partial index, through which the statements read there.
func unfinishedAmong(k string, swept, stragglers int) string {
	return fmt.Sprintf("(%[1]s.id > $%[2]d::bigint OR %[1]s.id = ANY($%[3]d::bigint[])) AND %[1]s.status <> 'finished'", k, swept, stragglers)
}

// unfinished returns the unfinished window, one round trip, after a sweep
// when one is due (and the window read again). On Citus, every key: the
// statements find the unfinished ones through the layout's partial index
// (see migrations/citus), as ids are numbered per worker there and no
// cursor over them holds.
func (s *Store) unfinished(ctx context.Context) (unfinishedWindow, error) {
	if s.q.citus {
		return unfinishedWindow{swept: math.MinInt64, stragglers: []int64{}}, nil
	}
	w, due, row, err := s.sweepState(ctx)
	if err != nil || !due {
		return w, err
	}
	if !row {
		if _, err := s.db.Exec(ctx, s.q.sweepEnsure); err != nil {
			return w, mapError(fmt.Errorf("pgstore: sweep: %w", err))
		}
	}
	if err := s.sweep(ctx); err != nil {
		return w, err
	}
	w, _, _, err = s.sweepState(ctx)
	return w, err
}

// sweepState reads the unfinished window, whether a sweep is due and
// whether idem_sweep has its row.
func (s *Store) sweepState(ctx context.Context) (w unfinishedWindow, due, row bool, err error) {
	err = s.db.QueryRow(ctx, s.q.sweepState, s.sweepLag.Microseconds()).Scan(&w.swept, &due, &row, &w.stragglers)
	if err != nil {
		err = mapError(fmt.Errorf("pgstore: read the sweep's cursor: %w", err))
	}
	return w, due, row, err
}

// sweepChunk is how many keys one of the sweep's statements lists at most,
// so that a sweep far behind (no operation ran for days, a bulk load)
// catches up in statements that each stay short.
const sweepChunk = 100_000

// sweep lists the keys up to the sweep's ready stop that are still
// unfinished, forgets the stragglers that finished, and moves the cursor
// to that stop (see queries.sweepClaim). Each chunk of ids is listed, and the
// cursor moved past it, in a transaction of its own. A sweep another
// process runs at the same time (its row locked), or one that is not due
// after all, leaves everything to that process.
func (s *Store) sweep(ctx context.Context) error {
	for done := false; !done; {
		// The claim is the transaction's first statement: it compares
		// sessions' snapshots by age, which counts from this transaction's
		// id once it has one. Read committed: each statement after it reads
		// with a snapshot taken after it (see queries.sweepClaim).
		err := pgx.BeginTxFunc(ctx, s.db, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
			var swept, ready, next int64
			err := tx.QueryRow(ctx, s.q.sweepClaim, s.sweepLag.Microseconds()).Scan(&swept, &ready, &next)
			if err == pgx.ErrNoRows {
				done = true
				return nil
			}
			if err != nil {
				return err
			}
			var end int64
			if err := tx.QueryRow(ctx, s.q.sweepChunkEnd, swept, ready, s.sweepChunk).Scan(&end); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, s.q.sweepList, swept, end); err != nil {
				return err
			}
			if end < ready {
				_, err = tx.Exec(ctx, s.q.sweepPass, end)
				return err
			}
			done = true
			if _, err := tx.Exec(ctx, s.q.sweepForget); err != nil {
				return err
			}
			_, err = tx.Exec(ctx, s.q.sweepMove, ready, next)
			return err
		})
		if err != nil {
			return mapError(fmt.Errorf("pgstore: sweep: %w", err))
		}
	}
	return nil
}
