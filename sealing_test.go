package idem_test

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/pgstore"
)

// declinedSealed stores, through a sealing store, a finished key "k1"
// whose charge was declined (402), and returns that store's runner.
func (b *testBundle) declinedSealed(t *testing.T) (*idem.Runner, *idemtype.Response) {
	t.Helper()
	b.provider.Decline(13)
	r := b.runnerOn(t, b.storeWith(t, &idemtype.Keyring{Current: "k1", Keys: map[string][]byte{"k1": sealKey1}}), nil)
	out, err := r.Execute(context.Background(), b.flow, b.request("k1", rideInput{Origin: "Secret St", Amount: 13}))
	require.NoError(t, err)
	require.Equal(t, http.StatusPaymentRequired, out.Response.Status)
	return r, out.Response
}

// Finding 2 of the security review: with a keyring, whoever can write the
// table cannot make the store replay what the flow did not answer: a body
// written in the clear in place of the sealed one (the key id cleared), or
// a status or headers changed under an intact sealed body, are refused
// (ErrCannotOpen) and not replayed; the untouched row replays as stored.
func TestSealedResponseCannotBeDowngradedOrRelabelled(t *testing.T) {
	t.Parallel()
	for name, tamper := range map[string]string{
		"plain body, key id cleared":     `UPDATE idem_keys SET response_key_id = NULL, response_status = 201, response_body = convert_to('{"status":"paid"}', 'UTF8')`,
		"body made NULL, key id cleared": `UPDATE idem_keys SET response_key_id = NULL, response_status = 201, response_body = NULL`,
		"status changed":                 `UPDATE idem_keys SET response_status = 201`,
		"headers changed":                `UPDATE idem_keys SET response_headers = '{"Content-Type": ["application/json"], "Location": ["/rides/1"]}'`,
		"flow changed":                   `UPDATE idem_keys SET flow = 'rides.other'`,
		"generation changed":             `UPDATE idem_keys SET generation = 1`,
		"finished relabelled abandoned":  `UPDATE idem_keys SET recovery_point = 'abandoned-by-operator'`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			r, stored := b.declinedSealed(t)
			out, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "Secret St", Amount: 13}))
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeReplayed, out.Kind)
			require.Equal(t, stored.Body, out.Response.Body)

			_, err = b.pool.Exec(ctx, tamper)
			require.NoError(t, err)
			out, err = r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "Secret St", Amount: 13}))
			t.Logf("%s: %v", name, err)
			require.ErrorIs(t, err, pgstore.ErrCannotOpen)
			require.Nil(t, out.Response, "nothing replayed")
		})
	}
}

// Params written in the clear in place of sealed ones, or sealed for
// another key, are not run by the completer: the key fails to open and its
// phases do not run.
func TestSealedParamsCannotBeDowngradedOrSwapped(t *testing.T) {
	t.Parallel()
	for name, tamper := range map[string]string{
		"plain params, key id cleared": `UPDATE idem_keys SET params_key_id = NULL, params = '{"origin": "Evil St", "amount": 5000}' WHERE key = 'k1'`,
		"another key's sealed params":  `UPDATE idem_keys SET params = (SELECT params FROM idem_keys WHERE key = 'k2') WHERE key = 'k1'`,
		"fingerprint changed":          `UPDATE idem_keys SET fingerprint = (SELECT fingerprint FROM idem_keys WHERE key = 'k2') WHERE key = 'k1'`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			st := b.storeWith(t, &idemtype.Keyring{Current: "k1", Keys: map[string][]byte{"k1": sealKey1}})
			crashing := b.runnerOn(t, st, &idem.Config{Test: idemtest.WithHook(idem.TestConfig{}, crashAt(idemtest.HookPhaseStart, "charge_created"))})
			for k, origin := range map[string]string{"k1": "Secret St", "k2": "Other St"} {
				_, err := crashing.Execute(ctx, b.flow, b.request(k, rideInput{Origin: origin, Amount: 5}))
				require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
			}
			_, err := b.pool.Exec(ctx, tamper)
			require.NoError(t, err)
			b.clock.Advance(time.Hour)

			res, err := b.runnerOn(t, st, nil).Complete(ctx, nil)
			require.NoError(t, err)
			t.Logf("%s: %+v", name, res)
			require.Equal(t, &idem.CompleteResult{Claimed: 2, Completed: 1, Failed: 1}, res)
			require.Zero(t, b.countRows(t, "rides WHERE charge_id IS NOT NULL AND origin = 'Secret St'"), "k1 was not run")
			require.Equal(t, 1, b.provider.Charges(), "k2 charged, k1 not")
			var status, recoveryPoint string
			require.NoError(t, b.pool.QueryRow(ctx, `SELECT status::text, recovery_point FROM idem_keys WHERE key = 'k1'`).Scan(&status, &recoveryPoint))
			require.Equal(t, "running", status)
			require.Equal(t, "ride_created", recoveryPoint, "k1 did not move on")
		})
	}
}

// sealV1 seals plain as v0.1 did (format 1: the byte 1, a 12-byte nonce, the
// AES-GCM ciphertext and tag) under key, bound to aad.
func sealV1(t *testing.T, key, plain []byte, aad string) []byte {
	t.Helper()
	block, err := aes.NewCipher(key)
	require.NoError(t, err)
	aead, err := cipher.NewGCM(block)
	require.NoError(t, err)
	out := append([]byte{1}, bytes.Repeat([]byte{7}, aead.NonceSize())...)
	return aead.Seal(out, out[1:], plain, []byte(aad))
}

// Rows sealed by v0.1 (format 1) keep working across a key rotation: a
// store whose current key is k2 and that still holds k1 replays a finished
// v0.1 row and completes an unfinished one from its v0.1 params; rows it
// seals itself open under the next rotation too.
func TestRowsSealedByV01KeepWorkingAcrossARotation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	clear := b.runnerOn(t, b.storeWith(t, nil), &idem.Config{Test: idemtest.WithHook(idem.TestConfig{}, crashAt(idemtest.HookPhaseStart, "charge_created"))})
	_, err := clear.Execute(ctx, b.flow, b.request("unfinished", rideInput{Origin: "Old St", Amount: 5}))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	finished, err := b.runnerOn(t, b.storeWith(t, nil), nil).Execute(ctx, b.flow, b.request("finished", rideInput{Origin: "Old St", Amount: 6}))
	require.NoError(t, err)

	// Seal both rows as v0.1 would have, with k1.
	var id int64
	var params string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT id, params::text FROM idem_keys WHERE key = 'unfinished'`).Scan(&id, &params))
	sealedParams, err := json.Marshal(base64.StdEncoding.EncodeToString(sealV1(t, sealKey1, []byte(params),
		fmt.Sprintf("idem params %d:%s %d:%s", len("user:1"), "user:1", len("unfinished"), "unfinished"))))
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `UPDATE idem_keys SET params = $1::jsonb, params_key_id = 'k1' WHERE id = $2`, string(sealedParams), id)
	require.NoError(t, err)
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT id FROM idem_keys WHERE key = 'finished'`).Scan(&id))
	_, err = b.pool.Exec(ctx, `UPDATE idem_keys SET response_body = $1, response_key_id = 'k1' WHERE id = $2`,
		sealV1(t, sealKey1, finished.Response.Body, fmt.Sprintf("idem response_body %d", id)), id)
	require.NoError(t, err)

	rotated := b.storeWith(t, &idemtype.Keyring{Current: "k2", Keys: map[string][]byte{"k1": sealKey1, "k2": sealKey2}})
	r := b.runnerOn(t, rotated, nil)
	out, err := r.Execute(ctx, b.flow, b.request("finished", rideInput{Origin: "Old St", Amount: 6}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
	require.Equal(t, finished.Response.Body, out.Response.Body)
	b.clock.Advance(time.Hour)
	res, err := r.Complete(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, &idem.CompleteResult{Claimed: 1, Completed: 1}, res)
	require.Equal(t, 1, b.countRows(t, "rides WHERE origin = 'Old St' AND charge_id IS NOT NULL AND key_id = (SELECT id FROM idem_keys WHERE key = 'unfinished')"))

	// What k2 sealed opens after the next rotation, k3 current.
	_, err = r.Execute(ctx, b.flow, b.request("new", rideInput{Origin: "New St", Amount: 7}))
	require.NoError(t, err)
	sealKey3 := bytes.Repeat([]byte{3}, 32)
	r3 := b.runnerOn(t, b.storeWith(t, &idemtype.Keyring{Current: "k3", Keys: map[string][]byte{"k1": sealKey1, "k2": sealKey2, "k3": sealKey3}}), nil)
	for _, k := range []string{"new", "unfinished"} {
		out, err := r3.Execute(ctx, b.flow, b.request(k, rideInput{Origin: map[string]string{"new": "New St", "unfinished": "Old St"}[k], Amount: map[string]float64{"new": 7, "unfinished": 5}[k]}))
		require.NoError(t, err, k)
		require.Equal(t, idem.OutcomeReplayed, out.Kind, k)
	}
}

// A store that seals with unkeyed fingerprints warns when the runner
// starts; with FingerprintKeys it does not.
func TestSealingWithUnkeyedFingerprintsWarns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st := b.storeWith(t, &idemtype.Keyring{Current: "k1", Keys: map[string][]byte{"k1": sealKey1}})
	var logs bytes.Buffer
	_, err := idem.NewRunner(st, &idem.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	require.Contains(t, logs.String(), "fingerprints are unkeyed")
	logs.Reset()
	_, err = idem.NewRunner(st, &idem.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil)), FingerprintKeys: &idemtype.Keyring{Current: "f1", Keys: map[string][]byte{"f1": bytes.Repeat([]byte{9}, 32)}}})
	require.NoError(t, err)
	require.False(t, strings.Contains(logs.String(), "unkeyed"), logs.String())
}
