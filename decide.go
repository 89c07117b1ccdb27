// A request's first steps: acquire its key in one statement, then decide
// (mismatch, replay, in progress, needs reconcile, or hold and resume).

package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
)

// execute acquires req's key, decides, and drives a key it holds. A new key
// commits on its own before its first phase runs: from then on it is there
// for a duplicate (in progress), another body (mismatch), operators and the
// completer, whatever the phase does.
func (r *Runner) execute(ctx context.Context, flow AnyFlow, req Request, stored *prepared) (*Outcome, error) {
	if err := req.normalise(); err != nil {
		return &Outcome{}, err
	}
	p := stored
	if p == nil && req.RetryOnly {
		var err error
		if p, err = r.retryInput(flow, &req); err != nil {
			return &Outcome{}, err
		}
	} else if p == nil {
		var err error
		if p, err = flow.prepare(&req, r.config.fingerprintKeys()); err != nil {
			return &Outcome{}, err
		}
	}
	sent := r.localNow()
	acq, err := r.acquire(ctx, flow, req, p, r.config.Admit != nil || p.fromKey)
	if err == nil && acq.Record == nil && stored != nil {
		return &Outcome{}, fmt.Errorf("%w: key %q is gone (reaped or abandoned); the completer does not create keys", ErrNotFound, req.Key)
	}
	if err == nil && acq.Record == nil && p.fromKey {
		return &Outcome{}, fmt.Errorf("%w: no key %q to retry; a retry-only request does not create one", ErrNotFound, req.Key)
	}
	if err == nil && acq.Record == nil {
		// There is no live key: this request would create one, which
		// Config.Admit may refuse.
		if out, err := r.admit(ctx, flow, req); err != nil {
			return out, err
		}
		sent = r.localNow()
		acq, err = r.acquire(ctx, flow, req, p, false)
	}
	ev := Event{Flow: flow.Name(), Scope: req.Scope, Key: req.Key}
	if err != nil {
		err = r.storeError(ctx, err)
		if ctx.Err() != nil {
			// The caller went away; the store did not fail. Execute labels
			// it OutcomeCanceled.
			return &Outcome{}, fmt.Errorf("acquire: %w", err)
		}
		ev.Kind, ev.Err = EventStoreError, err
		r.emit(ctx, ev)
		r.log.ErrorContext(ctx, "idem: acquire failed; nothing executed", r.logAttrs(req.Scope, req.Key, 0, "flow", flow.Name(), "err", r.redact(err))...)
		return &Outcome{}, fmt.Errorf("acquire: %w", err)
	}
	rec := acq.Record
	switch acq.Acquired {
	case idemdriver.AcquiredCreated:
		ev.Kind = EventCreated
		r.emit(ctx, ev)
		req.acquired(rec)
		return r.resume(ctx, r.hold(flow, rec, p.input, false, sent))
	case idemdriver.AcquiredTakenOver:
		ev.Kind = EventTakeover
		r.emit(ctx, ev)
		r.log.InfoContext(ctx, "idem: resuming an unfinished key", r.logAttrs(req.Scope, req.Key, rec.ID, "flow", flow.Name(),
			"recovery_point", rec.RecoveryPoint, "attempts", rec.Attempts, "last_error", rec.LastError)...)
		h := r.hold(flow, rec, p.input, true, sent)
		if p.fromKey {
			if req.RetryOnly && !flow.Redrives() {
				// Not the completer (which never takes such a flow's
				// keys): a retry whose input cannot drive the phases.
				return r.fail(ctx, h, fmt.Errorf("%w: flow %q cannot resume key %q from the input stored with it, and this retry's payload no longer makes one", ErrNoRedrive, flow.Name(), req.Key))
			}
			params := p.params
			if params == nil {
				params = rec.Params
			}
			if h.input, err = flow.decodeStored(params); err != nil {
				return r.undecodable(ctx, h, err)
			}
		}
		req.acquired(rec)
		return r.resume(ctx, h)
	}

	// Nothing was locked: report what is there. The mismatch check comes
	// first, so a different request learns nothing about this key's state.
	if !sameRequest(rec, flow, req, p) {
		ev.Kind = EventMismatch
		r.emit(ctx, ev)
		return &Outcome{}, fmt.Errorf("%w: key %q was first used by flow %q at %s %s, with its own params", ErrMismatch, req.Key, rec.Flow, rec.Method, rec.Path)
	}
	switch {
	case rec.Status == idemtype.StoredFinished && rec.RecoveryPoint == idemtype.RecoveryPointAbandoned:
		ev.Kind = EventReplayed
		r.emit(ctx, ev)
		return &Outcome{Record: rec}, fmt.Errorf("%w: key %q", ErrRequestAbandoned, req.Key)
	case rec.Status == idemtype.StoredFinished:
		ev.Kind = EventReplayed
		r.emit(ctx, ev)
		return &Outcome{replayed: true, Response: rec.Response(), Record: rec}, nil
	case rec.Status == idemtype.StoredNeedsReconcile:
		ev.Kind = EventNeedsReconcile
		r.emit(ctx, ev)
		return &Outcome{Record: rec}, fmt.Errorf("%w: key %q", ErrNeedsReconcile, req.Key)
	}
	ev.Kind = EventInProgress
	r.emit(ctx, ev)
	return &Outcome{Record: rec, RetryAfter: retryAfter(rec, acq.DBNow, r.config.MaxRetryAfter)},
		fmt.Errorf("%w: key %q", ErrInProgress, req.Key)
}

// retryInput is what a RetryOnly request brings: the fingerprint of its
// payload, and the key's stored input, decoded once the key is held.
func (r *Runner) retryInput(flow AnyFlow, req *Request) (*prepared, error) {
	if req.Payload == nil {
		return nil, fmt.Errorf("%w: a retry-only request needs its Payload", ErrInvalidRequest)
	}
	fps, err := fingerprints(r.config.fingerprintKeys(), flow.Name(), req.Target, req.Payload, req.PayloadBinary)
	if err != nil {
		return nil, err
	}
	return &prepared{fingerprints: fps, fromKey: true}, nil
}

// acquire is the acquisition of req's key, bounded by StatementTimeout.
// noCreate asks for an existing key only (see idemdriver.AcquireParams).
func (r *Runner) acquire(ctx context.Context, flow AnyFlow, req Request, p *prepared, noCreate bool) (*idemdriver.AcquireResult, error) {
	actx, cancel := r.storeContext(ctx)
	defer cancel()
	return r.store.Acquire(actx, idemdriver.AcquireParams{
		Scope: req.Scope, Key: req.Key, Flow: flow.Name(), Method: req.Method, Path: req.Path,
		Fingerprints: p.fingerprints, Params: p.params, Lease: r.config.Lease, NoCreate: noCreate, Now: r.now(),
		Retention: flow.retentionOr(r.config.Retention),
	})
}

// admit asks Config.Admit whether req may create a new key. Nothing has been
// written when it refuses.
func (r *Runner) admit(ctx context.Context, flow AnyFlow, req Request) (*Outcome, error) {
	err := r.config.Admit(ctx, req.Scope, flow.Name())
	if err == nil {
		return nil, nil
	}
	if !errors.Is(err, ErrTooManyKeys) {
		return &Outcome{}, fmt.Errorf("admit: %w", err)
	}
	wait := time.Second
	if tm, ok := errors.AsType[*TooManyKeysError](err); ok {
		wait = max(tm.RetryAfter, time.Second)
	}
	r.emit(ctx, Event{Kind: EventTooManyKeys, Flow: flow.Name(), Scope: req.Scope, Key: req.Key, Err: err})
	return &Outcome{RetryAfter: wait}, fmt.Errorf("admit: %w", err)
}

// retryAfter is the time left on the holder's lease, rounded up to whole
// seconds, at least one and at most limit. A row that looked takeable in
// the statement's snapshot but was not taken was just locked by someone
// else: one second. It is the one place a retry delay is computed; adapters
// only format it.
func retryAfter(rec *idemtype.KeyRecord, now time.Time, limit time.Duration) time.Duration {
	if rec.LeaseExpiresAt == nil || !rec.LeaseExpiresAt.After(now) {
		return time.Second
	}
	left := min(rec.LeaseExpiresAt.Sub(now), limit)
	secs := (left + time.Second - 1) / time.Second
	return max(secs, 1) * time.Second
}

// sameRequest reports whether req (prepared as p) is the request rec was
// first used for: the same flow, method, path and payload fingerprint (a
// key v0.1.0 finished is replayed to any payload, having no fingerprint of
// today's scheme).
func sameRequest(rec *idemtype.KeyRecord, flow AnyFlow, req Request, p *prepared) bool {
	return rec.Flow == flow.Name() && rec.Method == req.Method && rec.Path == req.Path && (rec.SameRequest(p.fingerprints) || rec.FromV01())
}
