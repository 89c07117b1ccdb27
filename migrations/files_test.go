package migrations_test

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/migrations"
)

// gooseSection is what goose runs of a file in one direction: the statement
// block after "-- +goose Up" (or Down).
func gooseSection(t *testing.T, file, direction string) string {
	t.Helper()
	re := regexp.MustCompile(`(?s)-- \+goose ` + direction + `\n-- \+goose StatementBegin\n(.*?)-- \+goose StatementEnd\n`)
	m := re.FindStringSubmatch(file)
	require.NotNil(t, m, "no %s section", direction)
	return m[1]
}

// One goose file per version, applied in order as goose applies a directory
// (each Up section in its own transaction): after each, the schema is at that
// version, so a later idem release's new file is simply the next one. Down
// sections in reverse leave nothing of idem behind, idem_migrations included.
func TestGooseFilesApplyOneVersionAtATime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	files, err := b.migrator.Files(migrations.FormatGoose)
	require.NoError(t, err)
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	require.Len(t, names, migrations.Latest())
	require.Equal(t, "00001_idem_idem_keys.sql", names[0])

	for i, name := range names {
		require.Equal(t, 1, strings.Count(files[name], "-- +goose Up"), "%s holds one version", name)
		tx, err := b.schema.Pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, gooseSection(t, files[name], "Up"))
		require.NoError(t, err, name)
		require.NoError(t, tx.Commit(ctx))
		v, err := b.migrator.Version(ctx)
		require.NoError(t, err)
		require.Equal(t, i+1, v, "after %s", name)
	}
	// The Go API agrees that nothing is left to apply.
	res, err := b.migrator.Up(ctx)
	require.NoError(t, err)
	require.Empty(t, res.Applied)

	for i := len(names) - 1; i >= 0; i-- {
		_, err := b.schema.Pool.Exec(ctx, gooseSection(t, files[names[i]], "Down"))
		require.NoError(t, err, names[i])
	}
	require.False(t, tableExists(t, b.schema.Pool, b.schema.Name+".idem_keys"))
	require.False(t, tableExists(t, b.schema.Pool, b.schema.Name+".idem_migrations"), "down leaves no bookkeeping behind")
}

// Reverting everything through the Go API drops idem_migrations too.
func TestDownToZeroLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.migrator.Up(ctx)
	require.NoError(t, err)
	_, err = b.migrator.Down(ctx, 0)
	require.NoError(t, err)
	require.False(t, tableExists(t, b.schema.Pool, b.schema.Name+".idem_migrations"))
	v, err := b.migrator.Version(ctx)
	require.NoError(t, err)
	require.Zero(t, v)
}
