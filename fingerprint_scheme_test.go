package idem_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemdriver"
)

// setFingerprint rewrites a key's stored fingerprint, as a binary before
// the payload fingerprint had its own column would have written it.
func (b *testBundle) setFingerprint(t *testing.T, key string, fp []byte) {
	t.Helper()
	tag, err := b.pool.Exec(context.Background(), `UPDATE idem_keys SET fingerprint = $1, payload_fingerprint = NULL WHERE key = $2`, fp, key)
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())
}

// inputFingerprint is the input scheme's fingerprint of in (the JSON of the
// decoded input), what keys written before the payload scheme carry.
func inputFingerprint(t *testing.T, key []byte, flow string, in any) []byte {
	t.Helper()
	js, err := json.Marshal(in)
	require.NoError(t, err)
	fp, err := idem.Fingerprint(flow, js)
	if key != nil {
		fp, err = idem.FingerprintHMAC(key, flow, js)
	}
	require.NoError(t, err)
	require.Len(t, fp, 32)
	return fp
}

// Keys written before fingerprints were taken over the payload carry a
// 32-byte fingerprint of the decoded input: their retries still match
// (compared the old way), keep that fingerprint (so the downstream keys of a
// key in flight do not change), and another input is still a mismatch.
func TestKeysFingerprintedBeforeThePayloadSchemeKeepMatching(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		key  []byte
	}{{"unkeyed", nil}, {"hmac", fingerprintKey}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			in := rideInput{Origin: "SF", Amount: 5}
			crash := b.runner(t, &idem.Config{FingerprintKey: tt.key, Test: idem.TestConfig{Hook: crashAt(idem.HookPhaseStart, "charge_created")}})
			_, err := crash.Execute(ctx, b.flow, b.request("in-flight", in))
			require.ErrorIs(t, err, idem.ErrSimulatedCrash)
			r := b.runner(t, &idem.Config{FingerprintKey: tt.key})
			_, err = r.Execute(ctx, b.flow, b.request("finished", in))
			require.NoError(t, err)
			old := inputFingerprint(t, tt.key, "rides.create", in)
			b.setFingerprint(t, "in-flight", old)
			b.setFingerprint(t, "finished", old)
			b.clock.Advance(time.Hour) // the crashed worker's lease is long gone

			out, err := r.Execute(ctx, b.flow, b.request("finished", in))
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeReplayed, out.Kind)
			_, err = r.Execute(ctx, b.flow, b.request("finished", rideInput{Origin: "LA", Amount: 5}))
			require.ErrorIs(t, err, idem.ErrMismatch, "other params are still another request")

			out, err = r.Execute(ctx, b.flow, b.request("in-flight", in))
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeExecuted, out.Kind)
			require.True(t, out.TookOver)
			require.Equal(t, old, b.key(t, "in-flight").Fingerprint, "it keeps its fingerprint")
			require.Equal(t, 2, b.provider.Charges())
			t.Logf("scheme-1 keys: finished replayed, in flight resumed (%s), other input %v", out.Kind, idem.ErrMismatch)
		})
	}
}

// A key carries two fingerprints (migration 0009): the payload's, which
// this release compares, and the decoded input's, which earlier releases
// compare and downstream keys derive from, so that a key made here and
// resumed by the previous release during a rolling upgrade sends its
// provider the downstream key it was sent here. The downstream scheme is
// written out, so a migration that changes the column's default (a revert
// of 0002's) changes nothing a new key sends.
func TestNewKeysCarryBothFingerprints(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		key  []byte
	}{{"unkeyed", nil}, {"hmac", fingerprintKey}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			_, err := b.pool.Exec(ctx, `ALTER TABLE idem_keys ALTER COLUMN downstream_scheme SET DEFAULT 1`)
			require.NoError(t, err)
			in := rideInput{Origin: "SF", Amount: 5}
			r := b.runner(t, &idem.Config{FingerprintKey: tt.key})
			out, err := r.Execute(ctx, b.flow, b.request("new", in))
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeExecuted, out.Kind)

			rec := b.key(t, "new")
			require.Equal(t, inputFingerprint(t, tt.key, "rides.create", in), rec.Fingerprint, "what the previous release computes")
			require.Len(t, rec.PayloadFingerprint, 33)
			require.Equal(t, byte(2), rec.PayloadFingerprint[0])
			require.Equal(t, idemdriver.DownstreamByRequest, rec.DownstreamScheme, "written, not the column's default")
			previous := idemdriver.KeyRecord{DownstreamScheme: idemdriver.DownstreamByRequest, Scope: rec.Scope, Key: rec.Key, Flow: rec.Flow,
				Fingerprint: inputFingerprint(t, tt.key, "rides.create", in)}
			require.Equal(t, previous.DownstreamKey("charge_created"), rec.DownstreamKey("charge_created"))

			// The payload decides: the same JSON with its members in
			// another order and spaced differently is this request.
			same := b.request("new", in)
			same.Params = json.RawMessage(`{ "amount": 5, "origin": "SF" }`)
			out, err = r.Execute(ctx, b.flow, same)
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeReplayed, out.Kind)
			_, err = r.Execute(ctx, b.flow, b.request("new", rideInput{Origin: "SF", Amount: 6}))
			require.ErrorIs(t, err, idem.ErrMismatch)
			// A member the input type ignores decodes to the same input
			// (the same input fingerprint) but is another payload.
			extra := b.request("new", in)
			extra.Params = json.RawMessage(`{"amount":5,"origin":"SF","coupon":"X"}`)
			_, err = r.Execute(ctx, b.flow, extra)
			require.ErrorIs(t, err, idem.ErrMismatch, "the payload decides, not the decoded input")
			t.Logf("fingerprint %x (input scheme), payload_fingerprint %x, downstream scheme %d with the column's default at 1",
				rec.Fingerprint[:6], rec.PayloadFingerprint[:7], rec.DownstreamScheme)
		})
	}
}

// The input scheme's canonical form is stricter than the payload scheme's:
// an input it refuses (a duplicate member inside a json.RawMessage field)
// still runs, as it did before keys kept both, and its key stores the
// payload fingerprint in place of the input scheme's.
func TestInputTheInputSchemeRefusesStillRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	type note struct {
		Meta json.RawMessage `json:"meta"`
	}
	flow := idem.MustNewFlow("notes.create", []idem.Phase[note]{{Name: "responded",
		Do: func(context.Context, idem.Tx, *idem.Attempt[note]) (idem.Result, error) {
			return idem.RespondJSON(201, map[string]bool{"ok": true}), nil
		}}}, nil)
	r := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{flow}})
	req := idem.Request{Scope: "user:1", Key: "dup", Method: "POST", Path: "/notes", Params: json.RawMessage(`{"meta":{"a":1,"a":2}}`)}
	_, err := idem.Fingerprint("notes.create", []byte(`{"meta":{"a":1,"a":2}}`))
	require.ErrorIs(t, err, idem.ErrInvalidParams, "the input scheme refuses it")
	out, err := r.Execute(ctx, flow, req)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	rec := b.key(t, "dup")
	require.Equal(t, rec.PayloadFingerprint, rec.Fingerprint)
	out, err = r.Execute(ctx, flow, req)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
}

// Keys made before the payload fingerprint had its own column carry it as
// their fingerprint (33 bytes, scheme 2): retries still match and resume,
// keeping the fingerprint, so their downstream keys do not change.
func TestKeysWithThePayloadFingerprintInPlaceKeepMatching(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	in := rideInput{Origin: "SF", Amount: 5}
	crash := b.runner(t, &idem.Config{Test: idem.TestConfig{Hook: crashAt(idem.HookPhaseStart, "charge_created")}})
	_, err := crash.Execute(ctx, b.flow, b.request("in-flight", in))
	require.ErrorIs(t, err, idem.ErrSimulatedCrash)
	r := b.runner(t, nil)
	_, err = r.Execute(ctx, b.flow, b.request("finished", in))
	require.NoError(t, err)
	for _, key := range []string{"in-flight", "finished"} {
		b.setFingerprint(t, key, b.key(t, key).PayloadFingerprint)
	}
	b.clock.Advance(time.Hour)

	out, err := r.Execute(ctx, b.flow, b.request("finished", in))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
	_, err = r.Execute(ctx, b.flow, b.request("finished", rideInput{Origin: "LA", Amount: 5}))
	require.ErrorIs(t, err, idem.ErrMismatch)
	before := b.key(t, "in-flight").Fingerprint
	out, err = r.Execute(ctx, b.flow, b.request("in-flight", in))
	require.NoError(t, err)
	require.True(t, out.TookOver)
	after := b.key(t, "in-flight")
	require.Equal(t, before, after.Fingerprint, "it keeps its fingerprint")
	require.Nil(t, after.PayloadFingerprint)
	require.Equal(t, 2, b.provider.Charges())
}

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
	_, err = b.flow.Execute(ctx, r, idem.Request{Scope: "u", Key: "struct"}, rideInput{Origin: "SF", Amount: 5})
	require.NoError(t, err)
	_, err = v2.Execute(ctx, r2, idem.Request{Scope: "u", Key: "struct"}, rideV2{Origin: "SF", Amount: 5})
	require.ErrorIs(t, err, idem.ErrMismatch)
	// ... unless the caller passes what it received as Payload.
	_, err = b.flow.Execute(ctx, r, idem.Request{Scope: "u", Key: "payload", Payload: body}, rideInput{Origin: "SF", Amount: 5})
	require.NoError(t, err)
	out, err = v2.Execute(ctx, r2, idem.Request{Scope: "u", Key: "payload", Payload: body}, rideV2{Origin: "SF", Amount: 5, Note: "server"})
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
	_, err = v2.Execute(ctx, r2, idem.Request{Scope: "u", Key: "payload", Payload: []byte(`{"origin":"LA","amount":5}`)}, rideV2{Origin: "SF", Amount: 5})
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
	crash := b.runner(t, &idem.Config{Test: idem.TestConfig{Hook: crashAt(idem.HookPhaseStart, "charge_created")}})
	_, err := crash.Execute(ctx, b.flow, idem.Request{Scope: "user:1", Key: "k1", Params: body})
	require.ErrorIs(t, err, idem.ErrSimulatedCrash)
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
