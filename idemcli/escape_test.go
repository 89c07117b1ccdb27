package idemcli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/internal/pgtest"
)

// hostile is text a client (or anyone who can write the table) may have put
// in a key's row: terminal escapes that clear the screen or set the window
// title, a carriage return that overwrites the line, C1 controls, a bidi
// override that reverses what follows, DEL.
const hostile = "a\x1b[2J\x1b]0;pwned\x07\rb\u009b31m\u202ec\x7f"

// insertHostileKeys puts two keys full of hostile text in the table, one
// finished and one in doubt, directly as SQL would.
func insertHostileKeys(t *testing.T, schema *pgtest.Schema) {
	t.Helper()
	ctx := context.Background()
	_, err := schema.Pool.Exec(ctx, `
INSERT INTO idem_keys (scope, key, flow, method, path, fingerprint, params, status, recovery_point,
                       response_status, response_headers, response_body, finished_at, expires_at, last_error)
VALUES ($1::text, $1::text || '-1', $1::text, 'POST', '/x' || $1::text, '\x00', jsonb_build_object('note', $1::text), 'finished', 'finished',
        201, jsonb_build_object('X-Note', jsonb_build_array($1::text)), convert_to($1::text, 'UTF8'), now(), now() + interval '1 hour', $1::text)`,
		hostile)
	require.NoError(t, err)
	_, err = schema.Pool.Exec(ctx, `
WITH k AS (
    INSERT INTO idem_keys (scope, key, flow, method, path, fingerprint, params, status, recovery_point, last_error)
    VALUES ($1::text, $1::text || '-2', $1::text, 'POST', '/x', '\x00', '{}', 'needs_reconcile', $1::text, $1::text)
    RETURNING scope, id, fence, recovery_point
)
INSERT INTO idem_leases (scope, key_id, fence, foreign_mark, foreign_mark_after)
SELECT scope, id, fence, $1::text, recovery_point FROM k`, hostile)
	require.NoError(t, err)
}

// Everything the CLI prints from the database is escaped: a table, a key
// shown in full, JSON, and the messages about a key.
func TestCLIEscapesTextFromTheDatabase(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewMigratedSchema(t)
	insertHostileKeys(t, schema)

	for _, args := range [][]string{
		{"keys", "list", "--all-scopes"},
		{"keys", "list", "--all-scopes", "--json"},
		{"keys", "list", "--all-scopes", "--json", "--reveal"},
		{"keys", "show", hostile + "-1", "--scope", hostile, "--reveal"},
		{"keys", "show", hostile + "-1", "--scope", hostile, "--reveal", "--json"},
		{"keys", "show", hostile + "-2", "--scope", hostile},
		{"keys", "unlock", hostile + "-2", "--scope", hostile},
	} {
		stdout, stderr, code := runDB(t, schema, nil, args...)
		require.Equal(t, ExitOK, code, "%q: %s", args, stderr)
		requireNoControls(t, stdout, strings.Join(args[:2], " "))
		requireNoControls(t, stderr, strings.Join(args[:2], " ")+" (stderr)")
		require.NotEmpty(t, stdout)
	}

	// JSON stays JSON, and decodes to the very text stored.
	stdout, _, code := runDB(t, schema, nil, "keys", "show", hostile+"-1", "--scope", hostile, "--json", "--reveal")
	require.Equal(t, ExitOK, code)
	var shown struct {
		Scope     string          `json:"scope"`
		LastError string          `json:"last_error"`
		Params    json.RawMessage `json:"params"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &shown))
	require.Equal(t, hostile, shown.Scope)
	require.Equal(t, hostile, shown.LastError)
	var params map[string]string
	require.NoError(t, json.Unmarshal(shown.Params, &params))
	require.Equal(t, hostile, params["note"])

	// A key that is not there is named escaped too.
	_, stderr, code := runDB(t, schema, nil, "keys", "show", "nope\x1b[2J", "--scope", hostile)
	require.Equal(t, ExitNotFound, code)
	requireNoControls(t, stderr, "not found")
}
