package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-idem/idem/idemdriver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

var _ idemdriver.PhaseAcquirer = (*Store)(nil)

// AcquiresInPhase implements idemdriver.PhaseAcquirer: not on Citus, where
// the acquisition is a function Citus delegates to the scope's worker as a
// statement of its own, outside a transaction block.
func (s *Store) AcquiresInPhase() bool { return !s.q.citus }

// AcquireInPhase implements idemdriver.PhaseAcquirer: BEGIN and the
// acquisition (queries.acquire) travel in one pipeline, as BEGIN and a
// phase's first statement do, so a new key costs no round trip more than a
// separate acquisition did, and one commit less. The acquisition function
// takes the key's advisory lock for the transaction before it inserts
// (0011_acquire_in_phase): a duplicate, whichever way it acquires, is
// answered ErrKeyBusy at once instead of waiting for this phase's commit.
//
// An uncommitted key has no lease for another worker to take over when its
// holder stalls; the server ends the transaction instead, once it has sat
// idle for the lease (idle_in_transaction_session_timeout, set for the
// transaction), and the key goes with it.
//
// A replay or a key in progress is answered as Acquire answers it, after a
// COMMIT of the transaction that read it (one round trip more than
// Acquire); anything unusual (a changed plan, a serialization failure, a
// key that came and went) is left to Acquire itself.
func (s *Store) AcquireInPhase(ctx context.Context, p idemdriver.AcquireParams, opts idemdriver.PhaseOptions) (*idemdriver.AcquireResult, idemdriver.PhaseTx, error) {
	if p.NoCreate || (opts.Isolation != "" && opts.Isolation != pgx.ReadCommitted) {
		// Nothing to create, or a snapshot that would not see the winner of
		// a race (see queries.acquire): the acquisition alone.
		res, err := s.Acquire(ctx, p)
		return res, nil, err
	}
	args, err := s.acquireArgs(p)
	if err != nil {
		return nil, nil, err
	}
	t, err := s.beginPhase(ctx, opts)
	if err != nil {
		return nil, nil, err
	}
	res := &idemdriver.AcquireResult{Record: &idemdriver.KeyRecord{}}
	t.idleTimeout = p.Lease
	br, err := t.beginWith(ctx, []*pgx.QueuedQuery{{SQL: s.q.acquire, Arguments: args}})
	if err == nil {
		err = br.QueryRow().Scan(append([]any{&res.Acquired, &res.DBNow}, recordDest(res.Record)...)...)
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = s.open(res.Record)
	}
	if err == nil && res.Acquired == idemdriver.AcquiredCreated && res.Record.Generation == 0 {
		return res, t, nil
	}
	if err == nil && res.Acquired == idemdriver.AcquiredCreated {
		// The key replaced an expired one: its generation, from which its
		// downstream keys derive, must be durable before any phase runs,
		// or a rollback would bring the expired key back, for the reaper
		// to delete and a retry to replace at generation 0, sending the
		// provider other keys. Commit it now, as Acquire would.
		if err := t.tx.Commit(ctx); err != nil {
			t.release()
			return nil, nil, mapError(fmt.Errorf("pgstore: acquire: %w", err))
		}
		t.release()
		return res, nil, nil
	}
	if err != nil {
		// The transaction failed, and holds nothing worth keeping.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), beginTimeout)
		_ = t.RollbackPhase(rctx)
		cancel()
		if keyBusy(err) {
			return nil, nil, fmt.Errorf("%w: key %q: %w", idemdriver.ErrKeyBusy, p.Key, err)
		}
		if ctx.Err() != nil || errors.Is(mapError(err), idemdriver.ErrStoreUnavailable) {
			return nil, nil, mapError(fmt.Errorf("pgstore: acquire: %w", err))
		}
		res, err := s.Acquire(ctx, p)
		return res, nil, err
	}
	// Not created: the function wrote nothing worth a transaction, except
	// when it deleted an expired key and then lost the insert to a
	// concurrent acquirer, which an autocommit call would have committed
	// too.
	err = t.tx.Commit(ctx)
	t.release()
	if err != nil {
		return nil, nil, mapError(fmt.Errorf("pgstore: acquire: %w", err))
	}
	res, err = s.takeOverIfAbandoned(ctx, p, res)
	return res, nil, err
}

// keyBusy reports whether err is the acquisition function's refusal to wait
// for another transaction that is creating the same key.
func keyBusy(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03" && pgErr.Message == "idem: key is being created by another transaction"
}
