package idemcli

import (
	"bytes"
	"context"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// runDB runs the CLI in-process against schema, as DATABASE_URL would.
func runDB(t *testing.T, schema *pgtest.Schema, cfg *Config, args ...string) (string, string, int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Stdout, c.Stderr = &stdout, &stderr
	c.Getenv = func(name string) string {
		if name == "DATABASE_URL" {
			return schema.URL
		}
		return ""
	}
	code := Dispatch(context.Background(), args, &c)
	return stdout.String(), stderr.String(), code
}

// tableExists reports whether idem_keys exists in the schema.
func tableExists(t *testing.T, schema *pgtest.Schema) bool {
	t.Helper()
	var ok bool
	require.NoError(t, schema.Pool.QueryRow(context.Background(),
		`SELECT to_regclass($1) IS NOT NULL`, schema.Name+".idem_keys").Scan(&ok))
	return ok
}

// requireNoControls fails if out holds a character a terminal may act on:
// a C0 or C1 control other than the newline, DEL, a format character (bidi
// overrides, zero-width characters), a line or paragraph separator, or
// bytes that are not UTF-8.
func requireNoControls(t *testing.T, out, what string) {
	t.Helper()
	for i, r := range out {
		if r == utf8.RuneError {
			t.Fatalf("%s: invalid UTF-8 at byte %d: %q", what, i, out)
		}
		if r == '\n' {
			continue
		}
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029' {
			t.Fatalf("%s: raw %U at byte %d in:\n%s", what, r, i, out)
		}
	}
}
