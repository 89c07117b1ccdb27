package idem_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
)

// Fingerprints are over what the caller passed: JSON params are
// fingerprinted as sent (canonicalised), so a Go caller that passes the
// bytes it received gets the HTTP adapter's guarantee across a deploy that
// changes the input type; Request.Payload overrides; Request.Target is
// bound to the key.
func TestGoAPIFingerprintsWhatTheCallerPassed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.runner(t, nil)
	type rideV2 struct {
		Origin string `json:"origin"`
		Amount int    `json:"amount"`
		Note   string `json:"note"`
	}
	v2 := idem.MustNewFlow("rides.create", []idem.Phase[rideV2]{{Name: "ride_created",
		Do: func(context.Context, idem.Tx, *idem.Attempt[rideV2]) (idem.Result, error) {
			return idem.RespondJSON(201, "v2"), nil
		}}}, nil)
	r2 := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{v2}})
	body := json.RawMessage(`{"origin":"SF","amount":5}`)

	_, err := r.Execute(ctx, b.flow, idem.Request{Scope: "u", Key: "raw", Params: body})
	require.NoError(t, err)
	out, err := r2.Execute(ctx, v2, idem.Request{Scope: "u", Key: "raw", Params: []byte(`{"amount":5, "origin":"S\u0046"}`)})
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind, "same JSON, after the input type gained a field")

	// A struct is fingerprinted as its JSON: that of the new type differs.
	_, err = idem.Execute(ctx, r, b.flow, idem.Request{Scope: "u", Key: "struct"}, rideInput{Origin: "SF", Amount: 5})
	require.NoError(t, err)
	_, err = idem.Execute(ctx, r2, v2, idem.Request{Scope: "u", Key: "struct"}, rideV2{Origin: "SF", Amount: 5})
	require.ErrorIs(t, err, idem.ErrMismatch)
	// ... unless the caller passes what it received as Payload.
	_, err = idem.Execute(ctx, r, b.flow, idem.Request{Scope: "u", Key: "payload", Payload: body}, rideInput{Origin: "SF", Amount: 5})
	require.NoError(t, err)
	out, err = idem.Execute(ctx, r2, v2, idem.Request{Scope: "u", Key: "payload", Payload: body}, rideV2{Origin: "SF", Amount: 5, Note: "server"})
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
	_, err = idem.Execute(ctx, r2, v2, idem.Request{Scope: "u", Key: "payload", Payload: []byte(`{"origin":"LA","amount":5}`)}, rideV2{Origin: "SF", Amount: 5})
	require.ErrorIs(t, err, idem.ErrMismatch, "another payload")

	// The target is bound to the key.
	_, err = r.Execute(ctx, b.flow, idem.Request{Scope: "u", Key: "target", Target: "/rides?x=1", Params: body})
	require.NoError(t, err)
	_, err = r.Execute(ctx, b.flow, idem.Request{Scope: "u", Key: "target", Target: "/rides?x=2", Params: body})
	require.ErrorIs(t, err, idem.ErrMismatch)
	_, err = r.Execute(ctx, b.flow, idem.Request{Scope: "u", Key: "t2", Target: "a\x00b", Params: body})
	require.ErrorIs(t, err, idem.ErrInvalidRequest)

	// Binary payloads are compared as bytes.
	_, err = r.Execute(ctx, b.flow, idem.Request{Scope: "u", Key: "bin", Payload: []byte{1, 2}, PayloadBinary: true, Params: body})
	require.NoError(t, err)
	out, err = r.Execute(ctx, b.flow, idem.Request{Scope: "u", Key: "bin", Payload: []byte{1, 2}, PayloadBinary: true, Params: body})
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
	_, err = r.Execute(ctx, b.flow, idem.Request{Scope: "u", Key: "bin", Payload: []byte{1, 3}, PayloadBinary: true, Params: body})
	require.ErrorIs(t, err, idem.ErrMismatch)
}

// Request.RetryOnly continues a key made from the same payload and never
// creates one: a key in flight resumes from the input stored with it, a
// finished key replays, and no key or another payload's key is refused.
func TestRetryOnlyContinuesTheKeyOfItsPayload(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	body := []byte(`{"origin":"SF","amount":20}`)
	crash := b.runner(t, &idem.Config{Test: idemtest.WithHook(idem.TestConfig{}, crashAt(idemtest.HookPhaseStart, "charge_created"))})
	_, err := crash.Execute(ctx, b.flow, idem.Request{Scope: "user:1", Key: "k1", Params: body})
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	b.clock.Advance(time.Hour)
	var amounts []float64
	b.hooks["charge_created"] = func(_ context.Context, _ idem.Tx, run *idem.Attempt[rideInput]) error {
		amounts = append(amounts, run.Input().Amount)
		return nil
	}
	r := b.runner(t, nil)
	retry := idem.Request{Scope: "user:1", Key: "k1", Payload: []byte(`{"amount": 20, "origin": "SF"}`), RetryOnly: true}
	out, err := r.Execute(ctx, b.flow, retry)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.True(t, out.TookOver)
	require.Equal(t, []float64{20}, amounts, "the phases see the stored input")
	out, err = r.Execute(ctx, b.flow, retry)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)

	other := retry
	other.Payload = []byte(`{"origin":"LA","amount":20}`)
	_, err = r.Execute(ctx, b.flow, other)
	require.ErrorIs(t, err, idem.ErrMismatch)
	other.Key = "k2"
	_, err = r.Execute(ctx, b.flow, other)
	require.ErrorIs(t, err, idem.ErrNotFound)
	require.Equal(t, 1, b.countRows(t, "rides"))
	var keys int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM idem_keys`).Scan(&keys))
	require.Equal(t, 1, keys, "a retry-only request creates no key")
	other.Payload = nil
	_, err = r.Execute(ctx, b.flow, other)
	require.ErrorIs(t, err, idem.ErrInvalidRequest)
}

// A key v0.1.0 finished carries v0.1.0's fingerprint (32 bytes, over the
// decoded input), which this release does not compute: a retry with the
// same flow, method and path replays it, never 422, while it is retained;
// another endpoint is still a mismatch.
func TestKeyFinishedByV01Replays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.runner(t, nil)
	first, err := r.Execute(ctx, b.flow, b.request("v01", rideInput{Origin: "SF", Amount: 5}))
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `UPDATE idem_keys SET fingerprint = $1 WHERE key = 'v01'`, make([]byte, 32))
	require.NoError(t, err)
	require.True(t, b.key(t, "v01").FromV01())

	out, err := r.Execute(ctx, b.flow, b.request("v01", rideInput{Origin: "SF", Amount: 5}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
	require.Equal(t, first.Response.Body, out.Response.Body)
	other := b.request("v01", rideInput{Origin: "SF", Amount: 5})
	other.Path = "/elsewhere"
	_, err = r.Execute(ctx, b.flow, other)
	require.ErrorIs(t, err, idem.ErrMismatch)
	require.Equal(t, 1, b.provider.Charges())
}
