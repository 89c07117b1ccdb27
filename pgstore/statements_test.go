package pgstore

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestStatements(t *testing.T) {
	t.Parallel()
	for sql, want := range map[string]int{
		``:                                     0,
		`  ; ;`:                                0,
		`SELECT 1`:                             1,
		`SELECT 1;`:                            1,
		`SELECT 1; -- done`:                    1,
		`SELECT 1; /* done */ ;`:               1,
		`INSERT INTO t VALUES (1); COMMIT`:     2,
		`SELECT ';' ; COMMIT`:                  2,
		`SELECT 'a;b', 'it''s;'`:               1,
		`SELECT E'\';' || 'x'`:                 1,
		`SELECT E'\'; COMMIT'`:                 1,
		`SELECT '\'; COMMIT; --'`:              2, // standard strings: no backslash escapes
		`SELECT "a;b" FROM t`:                  1,
		`DO $$ BEGIN PERFORM 1; END $$`:        1,
		`DO $f$ BEGIN; COMMIT; END $f$; END`:   2,
		`SELECT $1; COMMIT`:                    2,
		`SELECT $1::text`:                      1,
		`SELECT a$b; COMMIT`:                   2,
		`SELECT 1 -- ; COMMIT`:                 1,
		"SELECT 1 -- x\n; COMMIT":              2,
		`SELECT /* /* ; */ ; */ 1`:             1,
		`SELECT 1 /* unterminated ; COMMIT`:    1,
		`SELECT $tag$ a $other$ ; $tag$ ; END`: 2,
	} {
		require.Len(t, statements(sql), want, sql)
	}
	require.Equal(t, []string{"SELECT 1", " /* x */ COMMIT "}, statements("SELECT 1; /* x */ COMMIT ;"))
	for _, refused := range []string{`COMMIT`, `INSERT INTO t VALUES (1); COMMIT`, "SELECT ';'; -- x\n rollback", `SELECT 1;; begin`} {
		require.True(t, errors.Is(checkStatement(refused), ErrPhaseEndedTx), refused)
	}
	for _, fine := range []string{`INSERT INTO t VALUES (1);`, `INSERT INTO t VALUES (1); SET LOCAL lock_timeout = '5s'`,
		`SELECT 'x; COMMIT'`, `DO $$ BEGIN PERFORM 1; END $$`, `SELECT 1 -- ; COMMIT`} {
		require.NoError(t, checkStatement(fine), fine)
	}
}

// checkStatement gives the same verdict from its cache as from the lexer,
// for a refused and an accepted statement asked twice, and the cache stops
// growing at its bound: a phase that builds its SQL per request does not
// grow it without end.
func TestCheckStatementCachesItsVerdict(t *testing.T) {
	t.Parallel()
	for range 2 {
		require.ErrorIs(t, checkStatement(`SELECT 1; COMMIT -- cached`), ErrPhaseEndedTx)
		require.NoError(t, checkStatement(`SELECT 1 -- cached`))
	}
	v, ok := statementVerdicts.Load(`SELECT 1; COMMIT -- cached`)
	require.True(t, ok)
	require.ErrorIs(t, v.(*statementVerdict).err, ErrPhaseEndedTx)
	for i := range maxStatementVerdicts + 10 {
		require.NoError(t, checkStatement(fmt.Sprintf(`SELECT %d -- uncached`, i)))
	}
	require.LessOrEqual(t, statementVerdictCount.Load(), int64(maxStatementVerdicts))
}

// A statement that may change the session's statement_timeout is told
// apart from one that cannot, so the phase that sends it does not leave
// the store believing its per-connection setting still holds.
func TestStatementMayResetTimeout(t *testing.T) {
	t.Parallel()
	for _, resets := range []string{`SET statement_timeout = 0`, `select set_config('STATEMENT_TIMEOUT', '0', false)`,
		`RESET ALL`, `/* x */ discard all`, `SELECT 1; reset statement_timeout`, `SET SESSION statement_timeout TO 5`,
		`DO $$ BEGIN EXECUTE 'set statement_timeout = 0'; END $$`} {
		require.True(t, verdictOf(resets).mayResetTimeout, resets)
	}
	for _, keeps := range []string{`SELECT 1`, `INSERT INTO resets VALUES (1)`, `SET LOCAL lock_timeout = '1s'`,
		`SET LOCAL statement_timeout = '1s'`, `SELECT current_setting('statement_timeout')`} {
		require.False(t, verdictOf(keeps).mayResetTimeout, keeps)
	}
}
