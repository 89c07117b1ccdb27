package idemcli

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
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

// In a folder that holds the application's own migrations, tern and goose
// files are numbered after the highest number there, whatever the files
// are called, so the sequence stays unbroken (tern refuses a gap or a
// duplicate: "Missing migration 7"); idem's files already there, however
// numbered, are recognised by name and left alone.
func TestMigrateSQLNumbersAfterTheFoldersHighest(t *testing.T) {
	t.Parallel()
	for _, format := range []string{"tern", "goose"} {
		t.Run(format, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			for _, own := range []string{"001_create_users.sql", "002_add_email.sql"} {
				require.NoError(t, os.WriteFile(filepath.Join(dir, own), []byte("-- the app's own\n"), 0o644))
			}
			stdout, stderr, code := run(t, nil, "migrate", "sql", "--format", format, "--out-dir", dir)
			require.Equal(t, ExitOK, code, stderr)
			t.Logf("%s:\n%s", format, stdout)
			requireSequence(t, dir, 2+migrations.Latest())

			// An upgrade: idem's last file is not there yet; the team has
			// added a migration of its own meanwhile.
			matches, err := filepath.Glob(filepath.Join(dir, fmt.Sprintf("*%d_idem_*.sql", 2+migrations.Latest())))
			require.NoError(t, err)
			require.Len(t, matches, 1, "idem's last version is the folder's last file")
			require.NoError(t, os.Remove(matches[0]))
			own := fmt.Sprintf("%03d_add_phone.sql", 2+migrations.Latest())
			require.NoError(t, os.WriteFile(filepath.Join(dir, own), []byte("-- the app's own\n"), 0o644))
			stdout, stderr, code = run(t, nil, "migrate", "sql", "--format", format, "--out-dir", dir)
			require.Equal(t, ExitOK, code, stderr)
			t.Logf("%s after an upgrade:\n%s", format, stdout)
			require.Equal(t, 1, strings.Count(stdout, "wrote "), "only the new version")
			requireSequence(t, dir, 3+migrations.Latest())

			stdout, _, code = run(t, nil, "migrate", "sql", "--format", format, "--out-dir", dir)
			require.Equal(t, ExitOK, code)
			require.Contains(t, stdout, "already holds every migration")
		})
	}
}

// requireSequence checks that dir's files are numbered 1 to n, once each.
func requireSequence(t *testing.T, dir string, n int) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var got []int
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		require.True(t, ok, e.Name())
		v, err := strconv.Atoi(num)
		require.NoError(t, err, e.Name())
		got = append(got, v)
	}
	sort.Ints(got)
	want := make([]int, n)
	for i := range want {
		want[i] = i + 1
	}
	require.Equal(t, want, got)
}
