package idem_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/migrations"
	"github.com/go-idem/idem/pgstore"
)

var (
	sealKey1 = bytes.Repeat([]byte{1}, 32)
	sealKey2 = bytes.Repeat([]byte{2}, 32)
)

// storeWith is a store on the bundle's schema that seals with keyring (nil:
// in the clear).
func (b *testBundle) storeWith(t *testing.T, keyring *idemtype.Keyring) *pgstore.Store {
	t.Helper()
	st, err := pgstore.New(b.pool, &pgstore.Config{Schema: b.schema.Name, Keyring: keyring})
	require.NoError(t, err)
	t.Cleanup(st.Close)
	return st
}

func (b *testBundle) runnerOn(t *testing.T, st *pgstore.Store, cfg *idem.Config) *idem.Runner {
	t.Helper()
	if cfg == nil {
		cfg = &idem.Config{}
	}
	cfg.Test.Now = b.clock.Now
	if len(cfg.Flows) == 0 {
		cfg.Flows = []idem.AnyFlow{b.flow}
	}
	r, err := idem.NewRunner(st, cfg)
	require.NoError(t, err)
	return r
}

// rawKey is what the table holds for a key: its params as text and its
// response body's bytes, as anyone reading the table (or a backup) sees them.
func (b *testBundle) rawKey(t *testing.T, key string) (params string, body []byte, paramsKeyID, bodyKeyID *string) {
	t.Helper()
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT params::text, response_body, params_key_id, response_key_id FROM idem_keys WHERE key = $1`, key).
		Scan(&params, &body, &paramsKeyID, &bodyKeyID))
	return params, body, paramsKeyID, bodyKeyID
}

// pgstore.Config.Keyring seals a key's params and response body at rest with
// AES-256-GCM, naming the key each is sealed with per row, so keys rotate:
// rows keep opening with the key they were sealed with.
func TestCipherSealsParamsAndResponseAtRest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	plainBefore := b.runnerOn(t, b.storeWith(t, nil), nil)
	_, err := plainBefore.Execute(ctx, b.flow, b.request("clear", rideInput{Origin: "Clear St", Amount: 1}))
	require.NoError(t, err)

	k1 := b.storeWith(t, &idemtype.Keyring{Current: "k1", Keys: map[string][]byte{"k1": sealKey1}})
	r := b.runnerOn(t, k1, nil)
	first, err := r.Execute(ctx, b.flow, b.request("sealed", rideInput{Origin: "Secret St", Amount: 5}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, first.Kind)
	require.Contains(t, string(first.Response.Body), "ride_id")

	params, body, pk, bk := b.rawKey(t, "sealed")
	require.NotContains(t, params, "Secret St", "the table holds no plain input")
	require.NotContains(t, string(body), "ride_id", "nor the plain response")
	require.Equal(t, "k1", *pk)
	require.Equal(t, "k1", *bk)
	params, _, pk, bk = b.rawKey(t, "clear")
	require.Contains(t, params, "Clear St", "rows written in the clear stay readable")
	require.Nil(t, pk)
	require.Nil(t, bk)

	// The runner, the store and revealing listings see the plain values.
	out, err := r.Execute(ctx, b.flow, b.request("sealed", rideInput{Origin: "Secret St", Amount: 5}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
	require.Equal(t, first.Response.Body, out.Response.Body)
	rec, err := k1.GetKey(ctx, "user:1", "sealed")
	require.NoError(t, err)
	require.JSONEq(t, `{"origin": "Secret St", "amount": 5}`, string(rec.Params))
	require.Equal(t, "k1", rec.ParamsKeyID)
	// A row in the clear is what anyone who can write the table could put in
	// place of a sealed one: with a keyring it is refused, unless the
	// keyring accepts rows written before it (AcceptUnkeyed).
	out, err = r.Execute(ctx, b.flow, b.request("clear", rideInput{Origin: "Clear St", Amount: 1}))
	require.ErrorIs(t, err, pgstore.ErrCannotOpen)
	require.Nil(t, out.Response)
	accepting := b.runnerOn(t, b.storeWith(t, &idemtype.Keyring{Current: "k1", Keys: map[string][]byte{"k1": sealKey1}, AcceptUnkeyed: true}), nil)
	out, err = accepting.Execute(ctx, b.flow, b.request("clear", rideInput{Origin: "Clear St", Amount: 1}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)

	// Rotation: k2 seals new values, k1 still opens old ones.
	k2 := b.storeWith(t, &idemtype.Keyring{Current: "k2", Keys: map[string][]byte{"k1": sealKey1, "k2": sealKey2}})
	r2 := b.runnerOn(t, k2, nil)
	out, err = r2.Execute(ctx, b.flow, b.request("sealed", rideInput{Origin: "Secret St", Amount: 5}))
	require.NoError(t, err)
	require.Equal(t, first.Response.Body, out.Response.Body)
	_, err = r2.Execute(ctx, b.flow, b.request("newer", rideInput{Origin: "Other St", Amount: 5}))
	require.NoError(t, err)
	_, _, pk, bk = b.rawKey(t, "newer")
	require.Equal(t, "k2", *pk)
	require.Equal(t, "k2", *bk)

	// A store that lacks the key a row was sealed with fails clearly: never
	// a replay of what it cannot open.
	onlyK2 := b.runnerOn(t, b.storeWith(t, &idemtype.Keyring{Current: "k2", Keys: map[string][]byte{"k2": sealKey2}}), nil)
	out, err = onlyK2.Execute(ctx, b.flow, b.request("sealed", rideInput{Origin: "Secret St", Amount: 5}))
	require.ErrorIs(t, err, pgstore.ErrCannotOpen)
	require.ErrorContains(t, err, `"k1"`)
	require.Equal(t, idem.OutcomeFailed, out.Kind)
	require.Nil(t, out.Response)
	noKeys := b.runnerOn(t, b.storeWith(t, nil), nil)
	_, err = noKeys.Execute(ctx, b.flow, b.request("sealed", rideInput{Origin: "Secret St", Amount: 5}))
	require.ErrorIs(t, err, pgstore.ErrCannotOpen)

	// Listing needs no key unless it reveals the payload.
	list, err := noKeys.ListKeys(ctx, idemtype.KeyQuery{AllScopes: true})
	require.NoError(t, err)
	require.Len(t, list.Keys, 3)
	_, err = noKeys.ListKeys(ctx, idemtype.KeyQuery{AllScopes: true, Reveal: true})
	require.ErrorIs(t, err, pgstore.ErrCannotOpen)
	res, err := noKeys.UnlockKey(ctx, "user:1", "sealed", "")
	require.NoError(t, err, "an operator unlocks without the keyring")
	require.False(t, res.Unlocked)

	// A sealed value moved to another row does not open there (it is bound
	// to its row), and one that was tampered with does not open at all.
	_, err = b.pool.Exec(ctx, `UPDATE idem_keys SET response_body = (SELECT response_body FROM idem_keys WHERE key = 'newer') WHERE key = 'sealed'`)
	require.NoError(t, err)
	_, err = r2.Execute(ctx, b.flow, b.request("sealed", rideInput{Origin: "Secret St", Amount: 5}))
	require.ErrorIs(t, err, pgstore.ErrCannotOpen)
	_, err = b.pool.Exec(ctx, `UPDATE idem_keys SET response_body = set_byte(response_body, 20, get_byte(response_body, 20) # 1) WHERE key = 'newer'`)
	require.NoError(t, err)
	_, err = r2.Execute(ctx, b.flow, b.request("newer", rideInput{Origin: "Other St", Amount: 5}))
	require.ErrorIs(t, err, pgstore.ErrCannotOpen)

	// Reverting the migration that names the keys would make sealed rows
	// read as clear ones: it refuses while there are any (v0.1.0's 0004,
	// kept as released, raises it without SQLSTATE IDEM1).
	m, err := migrations.New(b.pool, &migrations.Config{Schema: b.schema.Name})
	require.NoError(t, err)
	_, err = m.Down(ctx, 2)
	require.ErrorContains(t, err, "sealed at rest")
	v, err := m.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v, "nothing was reverted")
}

// The completer and reconcile runs open the sealed input of the keys they
// resume.
func TestCompleterResumesASealedKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	st := b.storeWith(t, &idemtype.Keyring{Current: "k1", Keys: map[string][]byte{"k1": sealKey1}})
	_, err := b.runnerOn(t, st, &idem.Config{Test: idemtest.WithHook(idem.TestConfig{}, crashAt(idemtest.HookPhaseStart, "charge_created"))}).
		Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "Secret St", Amount: 5}))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	b.clock.Advance(time.Hour)

	res, err := b.runnerOn(t, b.storeWith(t, nil), nil).Complete(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, &idem.CompleteResult{Claimed: 1, Failed: 1}, res, "without the key the completer cannot resume it")
	b.clock.Advance(time.Hour)
	res, err = b.runnerOn(t, st, nil).Complete(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, &idem.CompleteResult{Claimed: 1, Completed: 1}, res)
	rec, err := st.GetKey(ctx, "user:1", "k1")
	require.NoError(t, err)
	require.Equal(t, idemtype.StoredFinished, rec.Status)
	require.Equal(t, 1, b.countRows(t, "rides WHERE origin = 'Secret St'"))
}

func TestKeyringIsChecked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, k := range map[string]*idemtype.Keyring{
		"no current":      {Keys: map[string][]byte{"k1": sealKey1}},
		"unknown current": {Current: "k2", Keys: map[string][]byte{"k1": sealKey1}},
		"short key":       {Current: "k1", Keys: map[string][]byte{"k1": sealKey1[:16]}},
		"bad id":          {Current: "k 1", Keys: map[string][]byte{"k 1": sealKey1}},
	} {
		_, err := pgstore.New(b.pool, &pgstore.Config{Keyring: k})
		require.Error(t, err, name)
	}
}

// A key whose sealed input cannot be opened is not left locked by the
// attempt that found out: neither a client's retry nor a reconcile run holds
// it for a lease.
func TestAKeyThatCannotBeOpenedIsNotLeftLocked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	k1 := b.storeWith(t, &idemtype.Keyring{Current: "k1", Keys: map[string][]byte{"k1": sealKey1}})
	_, err := b.runnerOn(t, k1, &idem.Config{Test: idemtest.WithHook(idem.TestConfig{}, crashAt(idemtest.HookPhaseStart, "charge_created"))}).
		Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "Secret St", Amount: 5}))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	b.clock.Advance(time.Hour)

	onlyK2 := b.storeWith(t, &idemtype.Keyring{Current: "k2", Keys: map[string][]byte{"k2": sealKey2}})
	r := b.runnerOn(t, onlyK2, nil)
	_, err = r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "Secret St", Amount: 5}))
	require.ErrorIs(t, err, pgstore.ErrCannotOpen)
	_, err = r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "Secret St", Amount: 5}))
	require.ErrorIs(t, err, pgstore.ErrCannotOpen, "still the clear error, not in progress")

	_, err = b.pool.Exec(ctx, `
		UPDATE idem_keys SET status = 'needs_reconcile';
		INSERT INTO idem_leases AS l (scope, key_id, fence, locked_at, lease_expires_at, foreign_mark, foreign_mark_after)
		SELECT scope, id, fence, locked_at, lease_expires_at, 'charge_created', recovery_point FROM idem_keys
		ON CONFLICT (scope, key_id) DO UPDATE SET foreign_mark = excluded.foreign_mark, foreign_mark_after = excluded.foreign_mark_after`)
	require.NoError(t, err)
	_, err = r.Reconcile(ctx, "user:1", "k1")
	require.ErrorIs(t, err, pgstore.ErrCannotOpen)
	rec, err := k1.GetKey(ctx, "user:1", "k1")
	require.NoError(t, err)
	require.Nil(t, rec.LockedAt, "the claim was let go")
	require.Equal(t, idemtype.StoredNeedsReconcile, rec.Status)
	require.Contains(t, rec.LastError, "cannot open")
	_, err = r.Reconcile(ctx, "user:1", "k1")
	require.ErrorIs(t, err, pgstore.ErrCannotOpen, "still the clear error, not in progress")
}
