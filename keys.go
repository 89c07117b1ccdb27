package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
)

// Operators look at keys by state rather than by raw status: a running key
// whose lease expired is as good as abandoned, and a finished key past its
// expiry is only waiting for the reaper. ListKeys and UnlockKey are what the
// CLI's `keys` commands run; applications can call them from admin pages.

// ListKeys returns the keys matching q, newest first, with the database
// clock they were read at. q names one Scope, or sets AllScopes to list every
// tenant's keys. Keys carry their metadata; their input, checkpoint data and
// response only with q.Reveal.
func (r *Runner) ListKeys(ctx context.Context, q idemtype.KeyQuery) (*idemtype.KeyList, error) {
	switch {
	case q.Scope == "" && !q.AllScopes:
		return nil, fmt.Errorf("%w: a scope is required; set AllScopes to list the keys of every scope", ErrInvalidRequest)
	case q.Scope != "" && q.AllScopes:
		return nil, fmt.Errorf("%w: a scope and AllScopes exclude each other", ErrInvalidRequest)
	}
	switch {
	case q.Limit == 0:
		q.Limit = 50
	case q.Limit < 0 || q.Limit > idemtype.MaxKeyListLimit:
		return nil, fmt.Errorf("%w: limit %d is outside 1-%d", ErrInvalidRequest, q.Limit, idemtype.MaxKeyListLimit)
	}
	if q.State != "" {
		st, err := idemtype.ParseKeyState(string(q.State))
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
		q.State = st
	}
	list, err := r.store.ListKeys(ctx, idemdriver.ListKeysParams{KeyQuery: q, Now: r.now()})
	if err != nil {
		r.emit(ctx, Event{Kind: EventStoreError, Scope: q.Scope, Key: q.Key, Err: err})
		return nil, fmt.Errorf("list keys: %w", err)
	}
	return list, nil
}

// GetKey returns one key, all of it, with the database clock it was read at,
// so its state can be classified. ErrNotFound when there is no such key.
func (r *Runner) GetKey(ctx context.Context, scope, key string) (*idemtype.KeyRecord, time.Time, error) {
	if scope == "" || key == "" {
		return nil, time.Time{}, fmt.Errorf("%w: scope and key are required", ErrInvalidRequest)
	}
	list, err := r.ListKeys(ctx, idemtype.KeyQuery{Scope: scope, Key: key, Limit: 1, Reveal: true})
	if err != nil {
		return nil, time.Time{}, err
	}
	if len(list.Keys) == 0 {
		return nil, list.Now, fmt.Errorf("%w: scope %q key %q", ErrNotFound, scope, key)
	}
	return list.Keys[0], list.Now, nil
}

// UnlockKey force-unlocks an unfinished key, for an operator facing a key
// that stays locked (a worker wedged with a live heartbeat, or a lease far
// longer than the outage). It moves the key's fence on, so the worker that
// held it can no longer commit a phase, heartbeat or release: its next
// attempt to do so fails with ErrLockLost and its phase rolls back. The key
// keeps its recovery point and any foreign-call mark, so the next attempt
// resumes (or goes to reconcile) exactly as after a crash.
//
// Unlocking cannot stop a foreign call already on the wire: a worker that
// was wedged inside a not-idempotent call may still complete it. Before a
// reconcile run decides such a call did not happen, make sure the old worker
// is gone (its process dead, or its call's own timeout passed).
//
// A finished key is returned unchanged with Unlocked false.
func (r *Runner) UnlockKey(ctx context.Context, scope, key, reason string) (*idemtype.UnlockResult, error) {
	if scope == "" || key == "" {
		return nil, fmt.Errorf("%w: scope and key are required", ErrInvalidRequest)
	}
	if reason == "" {
		reason = "unlocked by an operator"
	}
	res, err := r.store.UnlockKey(ctx, idemdriver.UnlockParams{Scope: scope, Key: key, Reason: reason})
	if err != nil {
		if !errors.Is(err, ErrNotFound) {
			r.emit(ctx, Event{Kind: EventStoreError, Scope: scope, Key: key, Err: err})
		}
		return nil, fmt.Errorf("unlock key: %w", err)
	}
	if res.Unlocked {
		r.log.WarnContext(ctx, "idem: key force-unlocked", r.logAttrs(scope, key, res.Record.ID, "flow", res.Record.Flow,
			"recovery_point", res.Record.RecoveryPoint, "fence", res.Record.Fence, "reason", reason)...)
	}
	return res, nil
}
