package idemcli

import (
	"context"
	"log/slog"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/pgstore"
)

type payment struct {
	Card   string `json:"card"`
	Amount int    `json:"amount"`
}

// finishPayment stores a finished key whose params, checkpoint and response
// all carry the card number.
func finishPayment(t *testing.T, schema *pgtest.Schema, scope, key string) {
	t.Helper()
	finishPaymentSealed(t, schema, scope, key, nil)
}

// finishPaymentSealed is finishPayment through a store sealing with keyring.
func finishPaymentSealed(t *testing.T, schema *pgtest.Schema, scope, key string, keyring *idemtype.Keyring) {
	t.Helper()
	flow := idem.MustNewFlow("payments.create", []idem.Phase[payment]{{
		Name: "paid",
		Do: func(_ context.Context, _ idem.Tx, run *idem.Attempt[payment]) (idem.Result, error) {
			if err := run.SetCheckpoint("card", run.Input().Card); err != nil {
				return idem.Result{}, err
			}
			return idem.Respond(http.StatusCreated, http.Header{"X-Card": {run.Input().Card}}, []byte(`{"card":"`+run.Input().Card+`"}`)), nil
		},
	}}, nil)
	store, err := pgstore.New(schema.Pool, &pgstore.Config{Keyring: keyring})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	r, err := idem.NewRunner(store, &idem.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	_, err = r.Execute(context.Background(), flow, idem.Request{Scope: scope, Key: key, Params: payment{Card: card, Amount: 5}})
	require.NoError(t, err)
}

const card = "4111111111111111"

// keys list needs a scope or --all-scopes; keys show and keys list print a
// key's metadata, and its params, checkpoint data and response only with
// --reveal.
func TestKeysListNeedsAScopeAndRevealsOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewMigratedSchema(t)
	finishPayment(t, schema, "tenant:1", "k1")
	finishPayment(t, schema, "tenant:2", "k1")

	for _, args := range [][]string{{"keys", "list"}, {"keys", "list", "--state", "finished"}, {"keys", "list", "--scope", "tenant:1", "--all-scopes"}} {
		stdout, stderr, code := runDB(t, schema, nil, args...)
		require.Equal(t, ExitUsage, code, args)
		require.Empty(t, stdout)
		require.Contains(t, stderr, "--all-scopes", args)
	}

	stdout, stderr, code := runDB(t, schema, nil, "keys", "list", "--all-scopes")
	require.Equal(t, ExitOK, code, stderr)
	require.Contains(t, stdout, "tenant:1")
	require.Contains(t, stdout, "tenant:2")
	stdout, _, code = runDB(t, schema, nil, "keys", "list", "--scope", "tenant:2", "--json")
	require.Equal(t, ExitOK, code)
	require.Contains(t, stdout, `"scope": "tenant:2"`)
	require.NotContains(t, stdout, "tenant:1")

	for _, args := range [][]string{
		{"keys", "list", "--all-scopes", "--json"},
		{"keys", "list", "--scope", "tenant:1"},
		{"keys", "show", "k1", "--scope", "tenant:1"},
		{"keys", "show", "k1", "--scope", "tenant:1", "--json"},
	} {
		stdout, stderr, code := runDB(t, schema, nil, args...)
		require.Equal(t, ExitOK, code, "%q: %s", args, stderr)
		require.NotContains(t, stdout, card, "%q shows metadata only", args)
		require.NotContains(t, stdout, `"params"`, args)
		require.NotContains(t, stdout, `"checkpoint"`, args)
	}
	stdout, _, _ = runDB(t, schema, nil, "keys", "show", "k1", "--scope", "tenant:1")
	require.Regexp(t, `(?m)^response status\s+201 Created$`, stdout)
	require.Regexp(t, `(?m)^payload\s+hidden: .*--reveal`, stdout)

	for _, args := range [][]string{
		{"keys", "list", "--all-scopes", "--json", "--reveal"},
		{"keys", "show", "k1", "--scope", "tenant:1", "--reveal"},
		{"keys", "show", "k1", "--scope", "tenant:1", "--json", "--reveal"},
	} {
		stdout, stderr, code := runDB(t, schema, nil, args...)
		require.Equal(t, ExitOK, code, "%q: %s", args, stderr)
		require.Contains(t, stdout, card, args)
	}
	stdout, _, _ = runDB(t, schema, nil, "keys", "show", "k1", "--scope", "tenant:1", "--reveal")
	require.Regexp(t, `(?m)^params\s+\{"card": "4111111111111111", "amount": 5\}$`, stdout)
	require.Regexp(t, `(?m)^response body\s+\{"card":"4111111111111111"\}$`, stdout)

	_, stderr, code = runDB(t, schema, nil, "keys", "show", "k9", "--scope", "tenant:1")
	require.Equal(t, ExitNotFound, code)
	require.Contains(t, stderr, "key not found")
}

// A key sealed at rest is listed and shown without the keyring; revealing
// its payload needs the application's keyring (Config.Keyring) and says so
// plainly without it.
func TestRevealingASealedKeyNeedsTheKeyring(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewMigratedSchema(t)
	keyring := &idemtype.Keyring{Current: "2026-01", Keys: map[string][]byte{"2026-01": []byte("0123456789abcdef0123456789abcdef")}}
	finishPaymentSealed(t, schema, "tenant:1", "k1", keyring)

	stdout, stderr, code := runDB(t, schema, nil, "keys", "show", "k1", "--scope", "tenant:1")
	require.Equal(t, ExitOK, code, stderr)
	require.Regexp(t, `(?m)^state\s+finished$`, stdout)
	require.Regexp(t, `(?m)^sealed at rest\s+params with key 2026-01, response body with key 2026-01$`, stdout)
	_, stderr, code = runDB(t, schema, nil, "keys", "show", "k1", "--scope", "tenant:1", "--reveal")
	require.Equal(t, ExitFailure, code)
	require.Contains(t, stderr, `sealed with key "2026-01"`)
	stdout, stderr, code = runDB(t, schema, &Config{Keyring: keyring}, "keys", "show", "k1", "--scope", "tenant:1", "--reveal", "--json")
	require.Equal(t, ExitOK, code, stderr)
	require.Contains(t, stdout, card)
	require.Contains(t, stdout, `"params_key_id": "2026-01"`)
}
