package pgstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
)

// The store on Citus: idem_keys and idem_leases distributed by scope
// (migrations.Config.Citus; migrations/citus/distribute.up.sql). New finds
// out by asking whether idem_keys is a distributed table. The statements
// are the same as on plain PostgreSQL (queries.go): each names the key's
// scope on every table it reads or writes, so Citus sends it whole to the
// one worker holding the scope, and the acquisition is idem_acquire
// distributed by its scope argument. What differs is here: the claim loops
// of the completer and the reaper, which on Citus read their candidates
// from every shard without a lock and then claim each by a router statement,
// and waits, which poll (the layout drops the notify triggers, which would
// notify on the worker that holds the key, where no store listens).

// Distributed reports whether the store runs on a Citus layout (idem_keys
// distributed by scope), as New found it.
func (s *Store) Distributed() bool { return s.q.citus }

// claimIdleCitus is ClaimIdle on Citus: the candidates, then a claim of each.
func (s *Store) claimIdleCitus(ctx context.Context, p idemdriver.ClaimIdleParams, w unfinishedWindow) ([]*idemtype.KeyRecord, error) {
	rows, err := s.db.Query(ctx, s.q.claimIdleCandidates, append([]any{
		p.Now, string(p.Status), p.Flows, p.IdleFor.Microseconds(), p.MaxAttempts, p.Limit, s.holder.instance, s.holder.boot},
		w.args()...)...)
	if err != nil {
		return nil, mapError(fmt.Errorf("pgstore: claim idle keys: %w", err))
	}
	type candidate struct {
		scope          string
		id, fence      int64
		lastRun, clock time.Time
	}
	var cands []candidate
	for rows.Next() {
		var c candidate
		if err := rows.Scan(&c.scope, &c.id, &c.fence, &c.lastRun, &c.clock); err != nil {
			rows.Close()
			return nil, mapError(fmt.Errorf("pgstore: claim idle keys: %w", err))
		}
		cands = append(cands, c)
	}
	if err := rows.Err(); err != nil {
		return nil, mapError(fmt.Errorf("pgstore: claim idle keys: %w", err))
	}
	var recs []*idemtype.KeyRecord
	for _, c := range cands {
		var rec idemtype.KeyRecord
		err := s.db.QueryRow(ctx, s.q.claimIdleOne, c.scope, c.id, c.fence, c.lastRun, c.clock).Scan(recordDest(&rec)...)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue // another claimer, or the key's own worker, moved it
		case err != nil:
			return recs, mapError(fmt.Errorf("pgstore: claim idle key: %w", err))
		}
		withoutPayload(&rec)
		recs = append(recs, &rec)
	}
	return recs, nil
}

// reapCitus is Reap on Citus: one batch read, then deleted in one
// statement (on the shards of the batch's scopes).
func (s *Store) reapCitus(ctx context.Context, p idemdriver.ReapParams) (int, error) {
	var deleted int
	err := s.inBatchTx(ctx, "reap", p.StatementTimeout, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.q.reapCandidates, p.Now, p.Limit)
		if err != nil {
			return err
		}
		var (
			scopes []string
			ids    []int64
			clock  time.Time
		)
		for rows.Next() {
			var scope string
			var id int64
			if err := rows.Scan(&scope, &id, &clock); err != nil {
				rows.Close()
				return err
			}
			scopes, ids = append(scopes, scope), append(ids, id)
		}
		if err := rows.Err(); err != nil || len(ids) == 0 {
			return err
		}
		tag, err := tx.Exec(ctx, s.q.reapDelete, scopes, ids, clock)
		deleted = int(tag.RowsAffected())
		return err
	})
	return deleted, err
}

// reapAbandonedCitus is ReapUnfinished on Citus: candidates, then each ended
// by a router statement of its own, so that a key another reaper (or a
// takeover) got to first is left alone.
func (s *Store) reapAbandonedCitus(ctx context.Context, p idemdriver.ReapUnfinishedParams, args []any) (idemdriver.ReapUnfinishedResult, error) {
	var res idemdriver.ReapUnfinishedResult
	type candidate struct {
		scope     string
		id, fence int64
		clock     time.Time
	}
	var cands []candidate
	err := s.inBatchTx(ctx, "reap unfinished keys", p.StatementTimeout, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.q.reapAbandonedCandidates, args...)
		if err != nil {
			return err
		}
		for rows.Next() {
			var c candidate
			if err := rows.Scan(&c.scope, &c.id, &c.fence, &c.clock); err != nil {
				rows.Close()
				return err
			}
			cands = append(cands, c)
		}
		return rows.Err()
	})
	if err != nil {
		return res, err
	}
	for _, c := range cands {
		var deleted, parked int
		err := s.inBatchTx(ctx, "reap abandoned key", p.StatementTimeout, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, s.q.leaseRowOf, c.scope, c.id, c.fence); err != nil {
				return err
			}
			return tx.QueryRow(ctx, s.q.reapAbandonedOne, c.scope, c.id, c.fence, c.clock).Scan(&deleted, &parked)
		})
		if err != nil {
			return res, err
		}
		res.Deleted += deleted
		res.NeedsReconcile += parked
	}
	return res, nil
}

// checkAllWaitedCitus is checkAllWaited on Citus: one router statement per
// key. A key whose check fails (its worker is down, say) is left out of the
// results, to be checked again later, and does not keep the others, whose
// workers answer, from being woken; the error is returned only when no key
// could be checked.
func (s *Store) checkAllWaitedCitus(ctx context.Context, refs []idemdriver.LockRef) (map[int64]waitState, error) {
	out := make(map[int64]waitState, len(refs))
	var first error
	for _, ref := range refs {
		over, left, err := s.checkWaited(ctx, ref)
		if errors.Is(err, pgx.ErrNoRows) {
			out[ref.ID] = waitState{over: true}
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return out, err
			}
			first = cmp.Or(first, err)
			continue
		}
		out[ref.ID] = waitState{over: over, left: left}
	}
	if len(out) == 0 && first != nil {
		return out, first
	}
	return out, nil
}

// useCitus switches the store to the claim loops of Citus, and its waits to
// polling: notifications would come from the workers, where nobody listens.
func (s *Store) useCitus() {
	s.q.forCitus()
	s.waits.mu.Lock()
	s.waits.conn = nil
	s.waits.mu.Unlock()
}
