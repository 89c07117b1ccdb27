package pgstore

import (
	"context"
	"fmt"
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
//     the keys created in the last minute or two, found by the id index;
//   - the stragglers (idem_stragglers): keys that were still unfinished when
//     the sweep's cursor passed them, a few (a request running for minutes,
//     a key parked for reconciliation, a key nobody has resumed yet).
//
// The sweep moves the cursor at most once per sweepLag: to next_id, the
// highest id it saw a lag earlier, after listing every key up to it that is
// still unfinished. An insert takes its id (nextval) after its statement
// began and commits when the statement ends, so once the lag has passed
// every key with an id up to next_id is committed (or never will be): the
// cursor never passes a key still on its way. The lag must exceed the
// longest an acquisition's statement runs, which the runner's statement
// timeout bounds. The same sweep forgets stragglers that have finished
// since.
//
// Whoever reads the unfinished keys (completer, reaper of unfinished keys,
// backlog, listings by state) sweeps first when the sweep is due, then
// reads the cursor and the stragglers' ids, and passes both to its
// statement, which reads (k.id > cursor OR k.id = ANY(stragglers)) through
// idem_keys_id and re-checks the status. A cursor read before another
// process moves it on is only a wider window.

// sweepLag is how long the sweep waits before moving its cursor to an id it
// saw: longer than any acquisition statement runs.
const sweepLag = time.Minute

// unfinishedWindow is where the unfinished keys are: ids past swept, and
// the stragglers.
type unfinishedWindow struct {
	swept      int64
	stragglers []int64
}

// args are the two parameters unfinishedAmong names.
func (w unfinishedWindow) args() []any { return []any{w.swept, w.stragglers} }

// unfinishedAmong is the condition that restricts k to the unfinished
// window passed as parameters $swept (bigint) and $stragglers (bigint[]):
// two ranges of idem_keys_id (a BitmapOr), never the finished millions.
func unfinishedAmong(k string, swept, stragglers int) string {
	return fmt.Sprintf("(%[1]s.id > $%[2]d::bigint OR %[1]s.id = ANY($%[3]d::bigint[]))", k, swept, stragglers)
}

// unfinished sweeps if the sweep is due, then returns the unfinished window.
func (s *Store) unfinished(ctx context.Context) (unfinishedWindow, error) {
	var w unfinishedWindow
	var due bool
	if err := s.db.QueryRow(ctx, s.q.sweepState, s.sweepLag.Microseconds()).Scan(&w.swept, &due); err != nil {
		return w, mapError(fmt.Errorf("pgstore: read the sweep's cursor: %w", err))
	}
	if due {
		swept, err := s.sweep(ctx)
		if err != nil {
			return w, err
		}
		w.swept = max(w.swept, swept)
	}
	if err := s.db.QueryRow(ctx, s.q.stragglers).Scan(&w.stragglers); err != nil {
		return w, mapError(fmt.Errorf("pgstore: read the stragglers: %w", err))
	}
	return w, nil
}

// sweep lists the keys up to the sweep's next stop that are still
// unfinished, forgets the stragglers that finished, and moves the cursor
// to that stop, in one transaction; it returns the cursor. A sweep another
// process runs at the same time (its row locked), or one that is not due
// after all, leaves everything to that process.
func (s *Store) sweep(ctx context.Context) (int64, error) {
	var swept int64
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.q.sweepEnsure); err != nil {
			return err
		}
		var next int64
		err := tx.QueryRow(ctx, s.q.sweepClaim, s.sweepLag.Microseconds()).Scan(&swept, &next)
		if err == pgx.ErrNoRows {
			return nil
		}
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.q.sweepList, swept, next); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.q.sweepForget); err != nil {
			return err
		}
		var newest int64
		if err := tx.QueryRow(ctx, s.q.newestID).Scan(&newest); err != nil {
			return err
		}
		swept = next
		_, err = tx.Exec(ctx, s.q.sweepMove, next, max(next, newest))
		return err
	})
	if err != nil {
		return 0, mapError(fmt.Errorf("pgstore: sweep: %w", err))
	}
	return swept, nil
}
