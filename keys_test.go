package idem_test

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
)

func TestListKeysByState(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()
	b.insertKeys(t, "running", 2, idemtype.KeyStateRunning, now)
	b.insertKeys(t, "stale", 3, idemtype.KeyStateStale, now)
	b.insertKeys(t, "reconcile", 4, idemtype.KeyStateNeedsReconcile, now)
	b.insertKeys(t, "finished", 5, idemtype.KeyStateFinished, now)
	b.insertKeys(t, "expired", 6, idemtype.KeyStateExpired, now)
	r := b.runner(t, nil)

	for state, want := range map[idemtype.KeyState]int{
		idemtype.KeyStateRunning: 2, idemtype.KeyStateStale: 3, idemtype.KeyStateNeedsReconcile: 4,
		idemtype.KeyStateFinished: 5, idemtype.KeyStateExpired: 6, "": 20,
	} {
		list, err := r.ListKeys(ctx, idemtype.KeyQuery{AllScopes: true, State: state})
		require.NoError(t, err, state)
		require.Len(t, list.Keys, want, state)
		require.Equal(t, now, list.Now.UTC(), "the runner's clock")
		for i, k := range list.Keys {
			if state != "" {
				require.Equal(t, state, k.State(list.Now), k.Key)
			}
			if i > 0 {
				require.Less(t, k.ID, list.Keys[i-1].ID, "newest first")
			}
		}
	}
	list, err := r.ListKeys(ctx, idemtype.KeyQuery{AllScopes: true, State: "needs_reconcile"})
	require.NoError(t, err)
	require.Len(t, list.Keys, 4, "the status spelling is accepted too")

	// Leases and expiry move with the clock.
	b.clock.Advance(2 * time.Hour)
	list, err = r.ListKeys(ctx, idemtype.KeyQuery{AllScopes: true, State: idemtype.KeyStateStale})
	require.NoError(t, err)
	require.Len(t, list.Keys, 5, "the running keys' leases expired")
	list, err = r.ListKeys(ctx, idemtype.KeyQuery{AllScopes: true, State: idemtype.KeyStateExpired})
	require.NoError(t, err)
	require.Len(t, list.Keys, 11)
}

func TestListKeysFilters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.insertKeys(t, "a", 30, idemtype.KeyStateFinished, b.clock.Now())
	r := b.runner(t, nil)
	_, err := r.Execute(ctx, b.flow, idem.Request{Scope: "tenant:9", Key: "mine", Params: rideInput{Origin: "SF"}})
	require.NoError(t, err)

	list, err := r.ListKeys(ctx, idemtype.KeyQuery{Scope: "tenant:9"})
	require.NoError(t, err)
	require.Len(t, list.Keys, 1)
	require.Equal(t, "mine", list.Keys[0].Key)

	list, err = r.ListKeys(ctx, idemtype.KeyQuery{AllScopes: true, Flow: "nope"})
	require.NoError(t, err)
	require.Empty(t, list.Keys)
	require.Equal(t, b.clock.Now(), list.Now.UTC(), "an empty page still carries the clock")

	// Paging: 31 keys in pages of 10.
	var seen []int64
	before := int64(0)
	for {
		list, err := r.ListKeys(ctx, idemtype.KeyQuery{AllScopes: true, Flow: "rides.create", Limit: 10, BeforeID: before})
		require.NoError(t, err)
		for _, k := range list.Keys {
			seen = append(seen, k.ID)
		}
		if len(list.Keys) < 10 {
			break
		}
		before = list.Keys[len(list.Keys)-1].ID
	}
	require.Len(t, seen, 31)

	rec, now, err := r.GetKey(ctx, "tenant:9", "mine")
	require.NoError(t, err)
	require.Equal(t, idemtype.KeyStateFinished, rec.State(now))
	_, _, err = r.GetKey(ctx, "tenant:9", "other")
	require.ErrorIs(t, err, idem.ErrNotFound)

	for name, q := range map[string]idemtype.KeyQuery{
		"bad state":      {AllScopes: true, State: "sleeping"},
		"negative limit": {AllScopes: true, Limit: -1},
		"huge limit":     {AllScopes: true, Limit: idemtype.MaxKeyListLimit + 1},
	} {
		_, err := r.ListKeys(ctx, q)
		require.ErrorIs(t, err, idem.ErrInvalidRequest, name)
	}
}

// Force-unlocking a key moves its fence on: the worker that held it, alive
// and mid-phase, cannot commit afterwards, and the next attempt resumes.
func TestUnlockKeyStopsALiveHolder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	inPhase, unlocked := make(chan struct{}), make(chan struct{})
	b.hooks["charge_created"] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		close(inPhase)
		<-unlocked
		return nil
	}
	holder := b.runner(t, nil)
	done := make(chan error, 1)
	go func() {
		_, err := holder.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
		done <- err
	}()
	<-inPhase
	before := b.key(t, "k1")

	res, err := b.runner(t, nil).UnlockKey(ctx, "user:1", "k1", "stuck behind a wedged worker")
	require.NoError(t, err)
	require.True(t, res.Unlocked)
	require.Greater(t, res.Record.Fence, before.Fence)
	require.Nil(t, res.Record.LockedAt)
	require.Equal(t, "stuck behind a wedged worker", res.Record.LastError)
	close(unlocked)

	err = <-done
	require.ErrorIs(t, err, idem.ErrLockLost)
	rec := b.key(t, "k1")
	require.Equal(t, "ride_created", rec.RecoveryPoint, "the charge phase did not commit")
	require.Equal(t, 0, b.countRows(t, "rides WHERE charge_id IS NOT NULL"))

	delete(b.hooks, "charge_created")
	out, err := b.runner(t, nil).Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.True(t, out.TookOver)
	require.Equal(t, 1, b.provider.Charges())

	// A finished key has nothing to unlock; an unknown one is not found.
	res, err = b.runner(t, nil).UnlockKey(ctx, "user:1", "k1", "")
	require.NoError(t, err)
	require.False(t, res.Unlocked)
	require.Equal(t, idemtype.StoredFinished, res.Record.Status)
	require.Equal(t, b.key(t, "k1").Fence, res.Record.Fence)
	_, err = b.runner(t, nil).UnlockKey(ctx, "user:1", "nope", "")
	require.True(t, errors.Is(err, idem.ErrNotFound))
	_, err = b.runner(t, nil).UnlockKey(ctx, "", "k1", "")
	require.ErrorIs(t, err, idem.ErrInvalidRequest)
}

func TestParseKeyState(t *testing.T) {
	t.Parallel()
	for _, st := range idemtype.KeyStates() {
		got, err := idemtype.ParseKeyState(string(st))
		require.NoError(t, err)
		require.Equal(t, st, got)
	}
	got, err := idemtype.ParseKeyState("needs_reconcile")
	require.NoError(t, err)
	require.Equal(t, idemtype.KeyStateNeedsReconcile, got)
	_, err = idemtype.ParseKeyState("done")
	require.ErrorContains(t, err, "unknown key state")
}

// Listing keys across tenants is explicit (AllScopes), as GetKey and
// UnlockKey refuse an empty scope; and a listing carries a key's metadata
// only, its input, checkpoint data and response only when asked (Reveal).
func TestListKeysNeedsAScopeOrAllScopes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.runner(t, nil)
	for _, scope := range []string{"tenant:1", "tenant:2"} {
		_, err := r.Execute(ctx, b.flow, idem.Request{Scope: scope, Key: "k1", Params: rideInput{Origin: "SF", Amount: 5}})
		require.NoError(t, err)
	}

	for name, q := range map[string]idemtype.KeyQuery{
		"no scope":                {},
		"no scope, by state":      {State: idemtype.KeyStateFinished},
		"a scope and all of them": {Scope: "tenant:1", AllScopes: true},
	} {
		_, err := r.ListKeys(ctx, q)
		require.ErrorIs(t, err, idem.ErrInvalidRequest, name)
	}

	list, err := r.ListKeys(ctx, idemtype.KeyQuery{AllScopes: true})
	require.NoError(t, err)
	require.Len(t, list.Keys, 2)
	list, err = r.ListKeys(ctx, idemtype.KeyQuery{Scope: "tenant:2"})
	require.NoError(t, err)
	require.Len(t, list.Keys, 1)
	k := list.Keys[0]
	require.Equal(t, "tenant:2", k.Scope)
	require.Equal(t, idemtype.StoredFinished, k.Status)
	require.Equal(t, 201, k.ResponseStatus, "metadata is listed")
	require.Nil(t, k.Params, "the input is not, without Reveal")
	require.Empty(t, k.Checkpoint)
	require.Empty(t, k.ResponseHeaders)
	require.Nil(t, k.ResponseBody)

	list, err = r.ListKeys(ctx, idemtype.KeyQuery{Scope: "tenant:2", Reveal: true})
	require.NoError(t, err)
	k = list.Keys[0]
	require.JSONEq(t, `{"origin": "SF", "amount": 5}`, string(k.Params))
	require.Contains(t, k.Checkpoint, "ride_id")
	require.NotEmpty(t, k.ResponseHeaders)
	require.NotEmpty(t, k.ResponseBody)

	// GetKey names one key of one scope, and returns all of it.
	rec, _, err := r.GetKey(ctx, "tenant:2", "k1")
	require.NoError(t, err)
	require.Equal(t, k.Params, rec.Params)
	require.Equal(t, k.ResponseBody, rec.ResponseBody)
}

// ListKeys without Reveal lists keys "without their payload": the statement
// selects NULL for the payload columns (params, checkpoint, response headers
// and body) instead of reading them and dropping them after the scan. 16
// keys of 1 MiB responses used to cost ~18 MiB for a listing that shows none
// of it.
//
// Not parallel: it measures the process's allocations.
func TestListKeysWithoutRevealReadsNoPayload(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	r := b.runner(t, nil)
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p"} {
		_, err := r.Execute(ctx, b.flow, b.request(k, rideInput{Origin: "SF", Amount: 1}))
		require.NoError(t, err)
	}
	_, err := b.pool.Exec(ctx, `UPDATE idem_keys SET response_body = convert_to(repeat('x', 1048576), 'UTF8')`)
	require.NoError(t, err)

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	list, err := r.ListKeys(ctx, idemtype.KeyQuery{AllScopes: true, Limit: 50})
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	require.Len(t, list.Keys, 16)
	require.Empty(t, list.Keys[0].ResponseBody)
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("a payload-free listing of 16 keys of 1 MiB responses allocated %d KiB", allocated>>10)
	require.Less(t, allocated, uint64(4<<20), "a payload-free listing of 16 keys allocated %d MiB", allocated>>20)
}
