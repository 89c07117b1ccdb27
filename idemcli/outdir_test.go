package idemcli

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/go-idem/idem/migrations"
	"github.com/stretchr/testify/require"
)

// migrate sql --out-dir writes one file per version, and on a later run only
// the files that are not there yet: an upgrade adds the new version's file.
func TestMigrateSQLWritesOneFilePerVersion(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "migrations")
	stdout, stderr, code := run(t, nil, "migrate", "sql", "--format", "goose", "--out-dir", dir)
	require.Equal(t, ExitOK, code, stderr)
	require.Contains(t, stdout, "wrote "+filepath.Join(dir, "00001_idem_idem_keys.sql"))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, migrations.Latest())

	// A file the team renumbered or applied stays as it is; a missing one
	// (the next version, after an upgrade) is written.
	require.NoError(t, os.Remove(filepath.Join(dir, entries[len(entries)-1].Name())))
	require.NoError(t, os.WriteFile(filepath.Join(dir, entries[0].Name()), []byte("-- edited\n"), 0o644))
	stdout, _, code = run(t, nil, "migrate", "sql", "--format", "goose", "--out-dir", dir)
	require.Equal(t, ExitOK, code)
	require.Equal(t, "wrote "+filepath.Join(dir, entries[len(entries)-1].Name())+"\n", stdout)
	edited, err := os.ReadFile(filepath.Join(dir, entries[0].Name()))
	require.NoError(t, err)
	require.Equal(t, "-- edited\n", string(edited))

	stdout, _, code = run(t, nil, "migrate", "sql", "--format", "goose", "--out-dir", dir)
	require.Equal(t, ExitOK, code)
	require.Contains(t, stdout, "already holds every migration")
}
