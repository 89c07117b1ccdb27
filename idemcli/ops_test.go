package idemcli

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/pgtest"
)

// Finding 3 of the security review: without a fingerprint key, a key's
// fingerprints are plain SHA-256 over what the client sent, and a guess at
// a small payload (an amount) can be checked against them. Unrevealed
// output leaves them out, text and JSON, keys list and keys show; --reveal
// shows them.
func TestUnrevealedOutputLeavesFingerprintsOut(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewMigratedSchema(t)
	finishPayment(t, schema, "tenant:1", "k1")
	var fingerprint []byte
	require.NoError(t, schema.Pool.QueryRow(context.Background(),
		`SELECT fingerprint FROM idem_keys WHERE key = 'k1'`).Scan(&fingerprint))
	require.NotEmpty(t, fingerprint)
	encodings := func(b []byte) []string {
		return []string{base64.StdEncoding.EncodeToString(b), hex.EncodeToString(b), base64.StdEncoding.EncodeToString(b)[:12], hex.EncodeToString(b)[:12]}
	}
	for _, args := range [][]string{
		{"keys", "list", "--all-scopes"},
		{"keys", "list", "--all-scopes", "--json"},
		{"keys", "show", "k1", "--scope", "tenant:1"},
		{"keys", "show", "k1", "--scope", "tenant:1", "--json"},
		{"keys", "show", "--id", "1", "--json"},
	} {
		stdout, stderr, code := runDB(t, schema, nil, args...)
		require.Equal(t, ExitOK, code, "%q: %s", args, stderr)
		require.NotContains(t, stdout, `fingerprint"`, args)
		require.NotRegexp(t, `(?m)^fingerprint\s`, stdout, args)
		for _, enc := range encodings(fingerprint) {
			require.NotContains(t, stdout, enc, args)
		}
	}
	stdout, stderr, code := runDB(t, schema, nil, "keys", "show", "k1", "--scope", "tenant:1", "--json", "--reveal")
	require.Equal(t, ExitOK, code, stderr)
	var shown struct {
		Fingerprint []byte `json:"fingerprint"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &shown))
	require.Equal(t, fingerprint, shown.Fingerprint)
}

// keys show prints the verdicts given on a key, in text and JSON, and still
// after the key is gone (the reaper deleted it): they are kept for good.
func TestKeysShowPrintsVerdictsAfterTheKeyIsGone(t *testing.T) {
	t.Parallel()
	f := newResolveFixture(t)
	f.inDoubt(t, "k1")
	stdout, stderr, code := runDB(t, f.schema, nil, "keys", "resolve", "k1", "--scope", "s", "--verdict", "abandon",
		"--operator", "alice", "--reason", "INC-42: refunded by hand")
	require.Equal(t, ExitOK, code, "%s%s", stdout, stderr)

	stdout, stderr, code = runDB(t, f.schema, nil, "keys", "show", "k1", "--scope", "s")
	t.Logf("keys show:\n%s", stdout)
	require.Equal(t, ExitOK, code, stderr)
	require.Regexp(t, `(?m)^verdict 1\s+abandon by alice at .*: INC-42: refunded by hand \(phase sent, not_idempotent, fence \d+, generation 0, key id \d+; database role postgres from .*\): finish the key as abandoned.*; answer: status 410, 0 bytes$`, stdout)

	_, err := f.schema.Pool.Exec(context.Background(), `DELETE FROM idem_keys WHERE key = 'k1'`) // as the reaper does
	require.NoError(t, err)
	stdout, stderr, code = runDB(t, f.schema, nil, "keys", "show", "k1", "--scope", "s", "--json")
	t.Logf("keys show of the reaped key: exit %d\n%s%s", code, stdout, stderr)
	require.Equal(t, ExitNotFound, code)
	var shown struct {
		Key      *idemtype.KeyRecord `json:"key"`
		Verdicts []idemtype.Verdict  `json:"verdicts"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &shown))
	require.Nil(t, shown.Key)
	require.Len(t, shown.Verdicts, 1)
	require.Equal(t, "abandon", shown.Verdicts[0].Verdict)
	require.Equal(t, "alice", shown.Verdicts[0].Operator)
	require.Equal(t, "postgres", shown.Verdicts[0].SessionUser)
}
