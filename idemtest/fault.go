package idemtest

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// errLostAck is what the kit makes a worker see after its commit succeeded.
var errLostAck = errors.New("idemtest: connection lost before the commit acknowledgement arrived")

// fault is what a scenario does to its first worker, once.
type fault struct {
	kind  Kind
	phase string
	// fired is set on the worker's goroutine and read after its call
	// returned.
	fired bool
	// finished: the key was finished when the fault fired (an after-commit
	// fault at a phase whose transaction stored the response).
	finished bool
	park     *parking
	bypass   *bypassWatch
}

func (f *fault) inject(ctx context.Context, w *worker) error {
	note := func(s string) {
		w.sc.mu.Lock()
		defer w.sc.mu.Unlock()
		w.notes = append(w.notes, s)
	}
	switch f.kind {
	case CrashBeforeCommit, CrashAfterForeign, CrashAfterCommit:
		note(fmt.Sprintf("dies at %s of %s", f.kind.where(), f.phase))
		return ErrSimulatedCrash
	case LostCommitAck:
		note("loses the commit acknowledgement of " + f.phase)
		return errLostAck
	case SerializationFailure:
		note("serialization failure injected at " + string(f.kind.where()) + " of " + f.phase)
		return &pgconn.PgError{Severity: "ERROR", Code: "40001", Message: "idemtest: injected serialization failure"}
	case LeaseTakeover:
		note("paused at " + string(f.kind.where()) + " of " + f.phase)
		return f.park.pause(ctx, w.sc.clock)
	}
	return nil
}
