package idem_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
)

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
