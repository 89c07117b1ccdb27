package idem

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/go-idem/idem/idemtype"
	"github.com/jackc/pgx/v5"
)

// Attempt is a phase's handle on its request: the decoded input, the key record,
// checkpoint data from earlier phases, the downstream idempotency key, and the
// one permitted foreign call. A Attempt is valid only during the phase call that
// received it.
type Attempt[In any] struct {
	h     *held
	input In
}

// Input returns the request's decoded input.
func (r *Attempt[In]) Input() In { return r.input }

// Key returns the key record as of the start of this phase's transaction
// (for a phase joined to the one before it, Phase.JoinPrevious, the
// transaction they share, so its recovery point is not the phase before).
// It is a copy; changing it changes nothing.
func (r *Attempt[In]) Key() *idemtype.KeyRecord { return r.h.rec.Clone() }

// Phase returns the running phase's name.
func (r *Attempt[In]) Phase() string { return r.h.phaseName() }

// Number counts this worker's tries of the phase, from 1; it grows when a
// serialization failure or deadlock makes the runner retry the phase (for
// joined phases, the transaction they share, from its first phase).
func (r *Attempt[In]) Number() int { return r.h.attempt }

// IdempotencyKey returns the downstream idempotency key for this phase's
// foreign call: stable across every retry, crash and takeover of this request,
// distinct for each phase, and derived from the request itself (scope, key,
// flow, fingerprint, phase; see KeyRecord.DownstreamKey), so it survives the
// loss of the key row in a failover. It is also passed to the Foreign
// callback.
func (r *Attempt[In]) IdempotencyKey() string { return r.h.downstreamKey() }

// Checkpoint decodes into dst what an earlier phase (or this one) recorded
// under name, and reports whether anything was recorded.
func (r *Attempt[In]) Checkpoint(name string, dst any) (bool, error) {
	raw, ok := r.h.patch[name]
	if !ok {
		raw, ok = r.h.rec.Checkpoint[name]
	}
	if !ok {
		return false, nil
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return true, fmt.Errorf("idem: decode checkpoint %q: %w", name, err)
	}
	return true, nil
}

// SetCheckpoint records v (as JSON) under name for later phases. It becomes
// durable with this phase's commit and is discarded if the phase rolls back,
// so later phases (on this worker or, after a crash, on another) see it
// exactly when they see the phase's own writes. Keep it small: ids and
// provider references, not documents.
func (r *Attempt[In]) SetCheckpoint(name string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("idem: encode checkpoint %q: %w", name, err)
	}
	if r.h.patch == nil {
		r.h.patch = map[string]json.RawMessage{}
	}
	r.h.patch[name] = raw
	return nil
}

// PgxTx returns the phase's transaction as a pgx.Tx, for libraries whose API
// takes one, such as River's Client.InsertTx to enqueue a job that commits
// with the phase. Its statements (and Begin, which makes a savepoint) go to
// the phase's transaction; Commit and Rollback do nothing and return
// ErrPhaseOwnsTx, because only the runner ends the transaction, with the key's
// recovery point. Use the phase's [Tx] for everything else.
func (r *Attempt[In]) PgxTx() pgx.Tx { return r.h.tx.PgxTx() }

// Foreign makes the phase's one foreign call: call receives the downstream
// idempotency key to send to the provider. name describes the call in logs
// and hooks ("charge", "send_sms").
//
// A second call in the same phase returns ErrSecondForeignCall without
// calling. In a ForeignNotIdempotent phase, Foreign first records the
// attempt durably; if that fails (the lock was lost, the store is down) the
// call is not made.
func (r *Attempt[In]) Foreign(ctx context.Context, name string, call func(ctx context.Context, idempotencyKey string) error) error {
	return r.h.foreign(ctx, name, call)
}
