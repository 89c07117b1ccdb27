package idem_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
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

var (
	fingerprintKey  = bytes.Repeat([]byte{7}, 32)
	fingerprintKey2 = bytes.Repeat([]byte{9}, 32)
)

// Config.FingerprintKeys makes fingerprints an HMAC under a server secret,
// so a stored fingerprint of a card number cannot be inverted by trying
// every number.
func TestFingerprintKeyedWithAServerSecret(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.runner(t, &idem.Config{FingerprintKeys: &idemtype.Keyring{Current: "k1", Keys: map[string][]byte{"k1": fingerprintKey}}})
	_, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 5}))
	require.NoError(t, err)

	// The payload scheme: byte 2, then the MAC of the flow, 0x00, the
	// target (none here), 0x00, 'j' and the canonical JSON of the input.
	canonical := []byte(`{"amount":5,"origin":"SF"}`)
	mac := hmac.New(sha256.New, fingerprintKey)
	mac.Write(append([]byte("rides.create\x00\x00j"), canonical...))
	require.Equal(t, mac.Sum([]byte{2}), b.key(t, "k1").Fingerprint)
	unkeyed := sha256.Sum256(append([]byte("rides.create\x00\x00j"), canonical...))
	require.NotEqual(t, append([]byte{2}, unkeyed[:]...), b.key(t, "k1").Fingerprint)

	out, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 5}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
	_, err = r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 6}))
	require.ErrorIs(t, err, idem.ErrMismatch)

	for name, k := range map[string]*idemtype.Keyring{
		"short current":   {Current: "k1", Keys: map[string][]byte{"k1": []byte("short")}},
		"short earlier":   {Current: "k1", Keys: map[string][]byte{"k1": fingerprintKey, "k0": []byte("short")}},
		"unknown current": {Current: "k2", Keys: map[string][]byte{"k1": fingerprintKey}},
		"bad id":          {Current: "k 1", Keys: map[string][]byte{"k 1": fingerprintKey}},
	} {
		_, err = idem.NewRunner(b.storeFor(t), &idem.Config{FingerprintKeys: k})
		require.ErrorContains(t, err, "FingerprintKeys", name)
	}
	_, err = idem.NewRunner(b.storeFor(t), &idem.Config{FingerprintKeys: &idemtype.Keyring{Current: "k1", Keys: map[string][]byte{"k1": []byte("short")}}})
	require.ErrorContains(t, err, "under 32")
}

// Switching fingerprints: keys made before the switch no longer match their
// retries, unless the old scheme is still accepted; then a key in flight is
// resumed (with the downstream key its first attempt sent) and a finished
// one replayed, and each keeps the fingerprint it has.
func TestSwitchingToAFingerprintKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	before := b.runner(t, &idem.Config{Test: idemtest.WithHook(idem.TestConfig{}, crashAt(idemtest.HookPhaseStart, "receipt_enqueued"))})
	_, err := before.Execute(ctx, b.flow, b.request("in-flight", rideInput{Origin: "SF", Amount: 5}))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	_, err = b.runner(t, nil).Execute(ctx, b.flow, b.request("finished", rideInput{Origin: "SF", Amount: 5}))
	require.NoError(t, err)
	inFlight := b.key(t, "in-flight")
	b.clock.Advance(time.Hour) // the crashed worker's lease is long gone

	// A switch that accepts nothing older: retries of older keys mismatch.
	strict := b.runner(t, &idem.Config{FingerprintKeys: &idemtype.Keyring{Current: "k1", Keys: map[string][]byte{"k1": fingerprintKey}}})
	for _, key := range []string{"in-flight", "finished"} {
		_, err := strict.Execute(ctx, b.flow, b.request(key, rideInput{Origin: "SF", Amount: 5}))
		require.ErrorIs(t, err, idem.ErrMismatch, key)
	}

	// The safe switch.
	r := b.runner(t, &idem.Config{FingerprintKeys: &idemtype.Keyring{
		Current: "k1", Keys: map[string][]byte{"k1": fingerprintKey}, AcceptUnkeyed: true,
	}})
	out, err := r.Execute(ctx, b.flow, b.request("in-flight", rideInput{Origin: "SF", Amount: 5}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.True(t, out.TookOver)
	require.Equal(t, 2, b.provider.Charges(), "one charge per key: the resumed key charged once")
	require.Equal(t, inFlight.Fingerprint, b.key(t, "in-flight").Fingerprint, "it keeps its fingerprint")
	out, err = r.Execute(ctx, b.flow, b.request("finished", rideInput{Origin: "SF", Amount: 5}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
	_, err = r.Execute(ctx, b.flow, b.request("finished", rideInput{Origin: "LA", Amount: 5}))
	require.ErrorIs(t, err, idem.ErrMismatch, "other params are still another request")

	// Rotating the key: the old one kept in Keys.
	_, err = r.Execute(ctx, b.flow, b.request("keyed", rideInput{Origin: "SF", Amount: 5}))
	require.NoError(t, err)
	rotated := b.runner(t, &idem.Config{FingerprintKeys: &idemtype.Keyring{
		Current: "k2", Keys: map[string][]byte{"k1": fingerprintKey, "k2": fingerprintKey2},
	}})
	out, err = rotated.Execute(ctx, b.flow, b.request("keyed", rideInput{Origin: "SF", Amount: 5}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
	_, err = rotated.Execute(ctx, b.flow, b.request("finished", rideInput{Origin: "SF", Amount: 5}))
	require.ErrorIs(t, err, idem.ErrMismatch, "unkeyed fingerprints are no longer accepted")
}
