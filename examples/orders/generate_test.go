package orders_test

import (
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
)

// The committed db package is what sqlc generates from schema.sql and
// query.sql. Checked where sqlc is installed
// (go install github.com/sqlc-dev/sqlc/cmd/sqlc@v1.29.0).
func TestGeneratedQueriesAreCurrent(t *testing.T) {
	t.Parallel()
	sqlc, err := exec.LookPath("sqlc")
	if err != nil {
		t.Skip("sqlc is not on PATH")
	}
	out, err := exec.Command(sqlc, "diff").CombinedOutput()
	require.NoError(t, err, "db/ differs from what sqlc generates; run go generate:\n%s", out)
}
