package pgstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
)

// The acquisition in plain SQL (queries.insertOrReport, queries.lookUp), and
// idem_acquire for what they leave to it.
//
// insertOrReport is one round trip for a new key, a replay and a key in
// progress, but sets up an insert even for a key that is there; lookUp sets
// up none, but a new key then takes a second statement. Each flow's recent
// acquisitions pick which goes first: after lookUpAfter acquisitions in a
// row that found their key (replays, keys in progress), lookUp; after any
// that created one, insertOrReport again. A flow whose requests are mostly
// new pays nothing for the habit, and one whose requests are mostly retries
// skips the insert. What neither statement settles (an expired key to
// replace, a race with a concurrent insert or reaper that only a new
// snapshot sees, a serialization failure) goes to idem_acquire's loop.
//
// On Citus the acquisition is idem_acquire alone: Citus sends the
// distributed function's call whole to the scope's worker, one task, while
// it plans insertOrReport's data-modifying CTE as several distributed steps.

// lookUpAfter is how many acquisitions of a flow in a row must find their
// key before the next one is sent as lookUp first.
const lookUpAfter = 4

// acquireHabits counts, per flow, the acquisitions in a row that found
// their key (up to lookUpAfter).
type acquireHabits struct {
	found sync.Map // flow name -> *atomic.Int32
}

func (h *acquireHabits) counter(flow string) *atomic.Int32 {
	if c, ok := h.found.Load(flow); ok {
		return c.(*atomic.Int32)
	}
	c, _ := h.found.LoadOrStore(flow, new(atomic.Int32))
	return c.(*atomic.Int32)
}

// lookUpFirst reports whether flow's next acquisition sends lookUp first.
func (h *acquireHabits) lookUpFirst(flow string) bool {
	return h.counter(flow).Load() >= lookUpAfter
}

// record notes what an acquisition of flow found.
func (h *acquireHabits) record(flow string, created bool) {
	c := h.counter(flow)
	if created {
		c.Store(0)
		return
	}
	if c.Load() < lookUpAfter {
		c.Add(1)
	}
}

// acquireInPlainSQL runs the plain-SQL acquisition for p, args being
// idem_acquire's (Store.acquireArgs). A nil result and nil error leave the
// acquisition to idem_acquire, after sent statements that settled nothing
// because of a concurrent writer (AcquireResult.Retried counts them).
func (s *Store) acquireInPlainSQL(ctx context.Context, p idemdriver.AcquireParams, args []any) (res *idemdriver.AcquireResult, sent int, err error) {
	lookUp := []any{args[0], args[1], args[2]}
	// idem_acquire's arguments without p_no_create ($10).
	insert := append(append(make([]any, 0, len(args)-1), args[:9]...), args[10:]...)
	type step struct {
		sql  string
		args []any
	}
	var steps []step
	switch {
	case s.q.citus:
		return nil, 0, nil
	case p.NoCreate:
		// No live key, no key: nothing to create, nothing for
		// idem_acquire to do either.
		steps = []step{{s.q.lookUp, lookUp}}
	case s.habits.lookUpFirst(p.Flow):
		steps = []step{{s.q.lookUp, lookUp}, {s.q.insertOrReport, insert}}
	default:
		steps = []step{{s.q.insertOrReport, insert}}
	}
	for i, st := range steps {
		res, err := s.acquisition(ctx, s.db, st.sql, st.args...)
		switch {
		case errors.Is(err, pgx.ErrNoRows) && st.sql == s.q.insertOrReport:
			// An expired key to replace, or a key inserted after the
			// statement's snapshot: idem_acquire's next read sees it.
			return nil, 1, nil
		case errors.Is(err, pgx.ErrNoRows):
			continue
		case errors.Is(err, ErrCannotOpen):
			return nil, 0, err
		case err != nil:
			if err = acquireError(err); errors.Is(err, idemtype.ErrSerialization) {
				return nil, 1, nil // idem_acquire's loop calls again
			}
			return nil, 0, err
		}
		s.habits.record(p.Flow, res.Acquired == idemdriver.AcquiredCreated)
		res.Retried = i
		return res, 0, nil
	}
	// lookUp found no live key.
	return &idemdriver.AcquireResult{Acquired: idemdriver.AcquiredNone}, 0, nil
}
