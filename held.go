package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/hooks"
)

// held is the runner's state for a key this worker holds the lock on, shared
// by the phases (and the reconcile hook) it runs; the per-attempt fields are
// reset by beginAttempt.
type held struct {
	runner *Runner
	flow   AnyFlow
	rec    *idemtype.KeyRecord
	ref    idemdriver.LockRef
	input  any
	// tookOver: this call resumed a key another attempt left unfinished.
	tookOver bool

	// phase is the running phase; first is the first phase of its
	// transaction, where every attempt starts (they differ only in a chain
	// of phases joined by Phase.JoinPrevious).
	phase, first int
	attempt      int
	// tx is the running attempt's transaction, for Attempt.PgxTx.
	tx    idemdriver.PhaseTx
	patch map[string]json.RawMessage
	// foreignBy names the phase that made the transaction's foreign call
	// this attempt, if any.
	foreignBy string
	// foreignErr is the error that foreign call returned this attempt: a
	// deadline in it is the provider's, not the store's (see classify).
	foreignErr error
	// foreignMarked survives attempts: once a not-idempotent call may have
	// happened, the request can only go forward by committing or reconcile.
	foreignMarked bool
	// reconciling: a reconcile hook runs for the phase; a failure leaves the
	// key in needs_reconcile rather than releasing it.
	reconciling bool
	crashed     bool
	// lettingGo tells the heartbeat that this worker is letting go of the
	// key (finishing, releasing, handing it to reconcile), so a refused beat
	// is expected rather than a lost lock.
	lettingGo atomic.Bool

	// leaseMu guards renewedAt: when this worker last sent a statement that
	// renewed its lease (the acquisition or a heartbeat; a phase commit
	// renews nothing, see lock.go). The lease is good until renewedAt +
	// Config.Lease by the local clock.
	leaseMu   sync.Mutex
	renewedAt time.Time
}

func (r *Runner) hold(flow AnyFlow, rec *idemtype.KeyRecord, input any, tookOver bool, acquiredAt time.Time) *held {
	return &held{runner: r, flow: flow, rec: rec, ref: idemdriver.LockRef{ID: rec.ID, Fence: rec.Fence, Scope: rec.Scope}, input: input,
		tookOver: tookOver, renewedAt: acquiredAt}
}

// nextPhase is the index of the phase after the key's recovery point: where
// the held key resumes.
func (h *held) nextPhase() (int, error) {
	i, ok := h.flow.resumeAt(h.rec.RecoveryPoint)
	if !ok {
		return 0, fmt.Errorf("%w: key %q is at %q, which flow %q does not have", ErrUnknownRecoveryPoint, h.rec.Key, h.rec.RecoveryPoint, h.flow.Name())
	}
	if i >= len(h.flow.PhaseNames()) {
		// A deploy dropped the phases after it (or made this one the last):
		// nothing is left to run, and no response is stored.
		return 0, fmt.Errorf("%w: key %q is at %q, now the last phase of flow %q: no phase is left to run and no response is stored",
			ErrUnknownRecoveryPoint, h.rec.Key, h.rec.RecoveryPoint, h.flow.Name())
	}
	return i, nil
}

// enterPhase moves to phase i, the first of a transaction, with a fresh
// attempt count.
func (h *held) enterPhase(i int) {
	if i != h.phase {
		h.foreignMarked = false
	}
	h.phase, h.first, h.attempt = i, i, 0
}

// beginAttempt starts a try of the transaction from its first phase.
func (h *held) beginAttempt() {
	h.attempt++
	h.phase = h.first
	h.patch, h.foreignBy, h.foreignErr = nil, "", nil
}

func (h *held) phaseName() string {
	if h.flow == nil { // a reconcile run for a flow this runner does not know
		return ""
	}
	name, _, _ := h.flow.phaseMeta(h.phase)
	return name
}

// downstreamKey is the idempotency key the phase's foreign call sends (see
// KeyRecord.DownstreamKey).
func (h *held) downstreamKey() string { return h.rec.DownstreamKey(h.flow.downstreamName(h.phase)) }

// committed updates the in-memory record to what a phase commit wrote.
func (h *held) committed(cp *idemdriver.CommitParams) {
	h.rec.RecoveryPoint, h.rec.Status, h.rec.ForeignMark = cp.RecoveryPoint, cp.Status, ""
	if h.rec.Checkpoint == nil {
		h.rec.Checkpoint = map[string]json.RawMessage{}
	}
	for n, v := range cp.CheckpointPatch {
		h.rec.Checkpoint[n] = v
	}
	if cp.Response != nil {
		h.rec.ResponseStatus, h.rec.ResponseHeaders, h.rec.ResponseBody = cp.Response.Status, cp.Response.Header, cp.Response.Body
		h.rec.LockedAt, h.rec.LeaseExpiresAt, h.rec.LastError = nil, nil, ""
	}
	h.foreignMarked = false
}

// renewed records that a statement sent at sent renewed the lease.
func (h *held) renewed(sent time.Time) {
	h.leaseMu.Lock()
	defer h.leaseMu.Unlock()
	if sent.After(h.renewedAt) {
		h.renewedAt = sent
	}
}

// leaseSafe reports whether the lease is certainly still this worker's:
// less than the lease minus a safety margin has passed since the last
// renewal this worker knows landed. After that, another worker may have
// taken the key over without this one hearing of it yet.
func (h *held) leaseSafe() bool {
	h.leaseMu.Lock()
	defer h.leaseMu.Unlock()
	cfg := h.runner.config
	return h.runner.localNow().Sub(h.renewedAt) < cfg.Lease-cfg.LeaseMargin
}

// logAttrs are the attributes of a log record about the held key.
func (h *held) logAttrs(attrs ...any) []any {
	return h.runner.logAttrs(h.rec.Scope, h.rec.Key, h.rec.ID, attrs...)
}

func (h *held) event(kind EventKind, err error) Event {
	return Event{Kind: kind, Flow: h.rec.Flow, Scope: h.rec.Scope, Key: h.rec.Key, Phase: h.phaseName(), Attempt: h.attempt, Err: err}
}

// outcome is the outcome of a held request so far; resp is its response
// when it responded.
func (h *held) outcome(resp *idemtype.Response) *Outcome {
	return &Outcome{Response: resp, Record: h.rec.Clone(), TookOver: h.tookOver}
}

// foreign makes the phase's one foreign call (see [Attempt.Foreign]).
func (h *held) foreign(ctx context.Context, name string, call func(ctx context.Context, idempotencyKey string) error) error {
	r := h.runner
	switch {
	case h.foreignBy == h.phaseName():
		return h.refuse(ctx, name, fmt.Errorf("%w: phase %q already made its foreign call; %q was not made", ErrSecondForeignCall, h.phaseName(), name))
	case h.foreignBy != "":
		return h.refuse(ctx, name, fmt.Errorf("%w: phase %q joins the transaction of phase %q, which already made its foreign call; %q was not made",
			ErrSecondForeignCall, h.phaseName(), h.foreignBy, name))
	}
	h.foreignBy = h.phaseName()
	_, kind, _ := h.flow.phaseMeta(h.phase)
	markedNow := false
	if kind == ForeignNotIdempotent && !h.foreignMarked {
		mctx, cancel := r.storeContext(ctx)
		err := r.store.MarkForeign(mctx, h.ref, h.phaseName())
		cancel()
		if err != nil {
			return fmt.Errorf("idem: could not record the attempt of %q, so it was not made: %w", name, r.storeError(ctx, err))
		}
		h.foreignMarked, markedNow = true, true
	}
	if err := r.hookAt(ctx, h, hooks.Point{Where: hooks.BeforeForeign, Foreign: name, DownstreamKey: h.downstreamKey()}); err != nil {
		return err
	}
	if !h.leaseSafe() {
		// Self-fencing: the lease may have lapsed while this worker was
		// paused (a GC, a stalled network), and another worker may own the
		// key already. Its foreign call must not race theirs.
		return fmt.Errorf("%w: the lease may have lapsed before %q; the call was not made", ErrLockLost, name)
	}
	key := h.downstreamKey()
	err := call(ctx, key)
	h.foreignErr = err
	if herr := r.hookAt(ctx, h, hooks.Point{Where: hooks.AfterForeign, Foreign: name, DownstreamKey: key}); herr != nil {
		return herr
	}
	if markedNow && errors.Is(err, ErrNotSent) {
		// The call says its request never left: nothing is in doubt, so
		// the mark made for it goes, and a failure of the phase is an
		// ordinary one. Should the mark stay (the store is down, the
		// lock was lost), the key goes to reconcile as before.
		if werr := r.withdrawMark(ctx, h); werr != nil {
			return fmt.Errorf("%w (and %w)", err, werr)
		}
		h.foreignMarked = false
		r.log.InfoContext(ctx, "idem: a not-idempotent call was not sent; its mark is withdrawn", h.logAttrs("flow", h.flow.Name(), "phase", h.phaseName(), "foreign", name)...)
	}
	return err
}
