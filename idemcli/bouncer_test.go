package idemcli

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/internal/pgtest"
)

// The CLI through PgBouncer in transaction pooling mode, with a
// DATABASE_URL that names no exec mode (as an operator would paste it):
// every command works, and keeps working on later runs, when server
// connections already hold the statements an earlier run prepared.
func TestCLIThroughPgBouncer(t *testing.T) {
	t.Parallel()
	bounced := pgtest.NewBouncedSchema(t)
	run := func(args ...string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		code := Dispatch(context.Background(), args, &Config{
			Stdout: &stdout, Stderr: &stderr,
			Getenv: func(name string) string {
				if name == "DATABASE_URL" {
					return bounced.BouncedURL
				}
				return ""
			},
		})
		require.Equal(t, ExitOK, code, "idem %v: %s", args, stderr.String())
		return stdout.String()
	}
	_, err := bounced.Pool.Exec(context.Background(), `
WITH k AS (
    INSERT INTO idem_keys (scope, key, flow, method, path, fingerprint, params)
    VALUES ('s', 'k1', 'payments.create', 'POST', '/', '\x00', '{}')
    RETURNING scope, id, fence
)
INSERT INTO idem_leases (scope, key_id, fence) SELECT scope, id, fence FROM k`)
	require.NoError(t, err)
	for round := range 3 {
		run("migrate", "up")
		require.NotEmpty(t, run("migrate", "status"), "round %d", round)
		require.Contains(t, run("keys", "list", "--scope", "s"), "k1")
		require.Contains(t, run("keys", "show", "k1", "--scope", "s"), "payments.create")
		require.Contains(t, run("reap"), "reaped 0 expired")
	}
}
