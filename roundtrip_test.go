package idem_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/internal/wirecount"
)

// Semantics 14: acquisition costs one round trip for a new key, a replay and
// an in-progress key, counted with a pgx tracer (and on the socket).
func TestAcquisitionIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var counter *wirecount.Counter
	store := storeOn(t, b.schema, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 1 // one connection, so its statement cache is warm after the warm-up
		counter = wirecount.Install(cfg.ConnConfig)
	})
	// snapshot returns what was sent since the last snapshot.
	last := counter.Position()
	snapshot := func() (sqls []string, prepares, writes int64) {
		now := counter.Position()
		s := counter.Between(last, now)
		last = now
		return s.Statements, s.Prepares, s.Writes
	}
	// oneRoundTrip checks that what was sent since the last snapshot is one
	// statement, prepared before, in one socket write, and returns it.
	oneRoundTrip := func(t *testing.T) string {
		t.Helper()
		sqls, prepares, writes := snapshot()
		require.Len(t, sqls, 1)
		require.Zero(t, prepares)
		require.Equal(t, int64(1), writes, "one round trip on the wire")
		return sqls[0]
	}

	// writesAt records the socket writes seen at each hook point of the
	// request being measured.
	type mark struct {
		where idemtest.HookWhere
		phase string
		n     int64
	}
	var (
		measuring       bool
		marks           []mark
		crashAfterFirst bool
	)
	r, err := idem.NewRunner(store, &idem.Config{Test: idemtest.WithHook(idem.TestConfig{Now: b.clock.Now}, func(_ context.Context, at idemtest.HookPoint) error {
		if measuring {
			marks = append(marks, mark{at.Where, at.Phase, counter.Position().Writes - last.Writes}) // since the last snapshot
		}
		if at.Where == idemtest.HookAfterCommit && crashAfterFirst {
			return idemtest.ErrSimulatedCrash
		}
		return nil
	})})
	require.NoError(t, err)

	// Warm up: pgx prepares each statement once per connection (one extra
	// round trip, the first time only). Run every path once.
	_, err = r.Execute(ctx, b.flow, b.request("warm", rideInput{Origin: "SF", Amount: 1}))
	require.NoError(t, err)
	_, err = r.Execute(ctx, b.flow, b.request("warm", rideInput{Origin: "SF", Amount: 1}))
	require.NoError(t, err)
	snapshot()

	// Each phase of the test flow sends one statement of its own, so it may
	// cost two round trips: that statement (carrying BEGIN) and the guarded
	// recovery-point update (carrying COMMIT).
	t.Run("new key, and one round trip per phase beyond its statements", func(t *testing.T) {
		measuring = true
		_, err := r.Execute(ctx, b.flow, b.request("new", rideInput{Origin: "SF", Amount: 2}))
		measuring = false
		require.NoError(t, err)
		sqls, prepares, writes := snapshot()
		require.Zero(t, prepares)
		require.Regexp(t, `INSERT INTO \S*idem_keys(.|\n)*ON CONFLICT ON CONSTRAINT idem_keys_scope_key DO NOTHING`, sqls[0],
			"the first statement is the acquisition, in plain SQL")
		// The key commits on its own (the acquisition's statement, in
		// autocommit), then three commits for the three phases.
		require.Equal(t, 3, count(sqls, "commit"), "commits: %q", sqls)

		require.Equal(t, mark{idemtest.HookPhaseStart, "ride_created", 1}, marks[0], "acquisition: one round trip, and no BEGIN of its own before the phase")
		starts := map[string]int64{}
		for _, m := range marks {
			switch m.where {
			case idemtest.HookPhaseStart:
				starts[m.phase] = m.n
			case idemtest.HookAfterCommit:
				require.Equal(t, int64(2), m.n-starts[m.phase], "phase %s: its statement + the guarded commit", m.phase)
			}
		}
		require.Len(t, starts, 3)
		require.Equal(t, int64(1+3*2), writes, "the whole request")
	})

	t.Run("replay", func(t *testing.T) {
		out, err := r.Execute(ctx, b.flow, b.request("new", rideInput{Origin: "SF", Amount: 2}))
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeReplayed, out.Kind)
		oneRoundTrip(t)
	})

	t.Run("in progress", func(t *testing.T) {
		crashAfterFirst = true
		out, err := r.Execute(ctx, b.flow, b.request("held", rideInput{Origin: "SF", Amount: 3}))
		require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
		crashAfterFirst = false
		snapshot()

		out, err = r.Execute(ctx, b.flow, b.request("held", rideInput{Origin: "SF", Amount: 3}))
		require.ErrorIs(t, err, idem.ErrInProgress)
		require.Equal(t, idem.OutcomeInProgress, out.Kind)
		oneRoundTrip(t)
	})

	// A flow whose acquisitions keep finding their key sends its next ones
	// as a plain SELECT, still one round trip, with no insert to set up; a
	// new key then costs a second statement, after which the flow's
	// acquisitions insert first again.
	t.Run("a flow of replays looks its keys up", func(t *testing.T) {
		// Enough replays to change the habit, and to prepare the lookup.
		for range 6 {
			_, err := r.Execute(ctx, b.flow, b.request("new", rideInput{Origin: "SF", Amount: 2}))
			require.NoError(t, err)
		}
		snapshot()
		for range 3 {
			out, err := r.Execute(ctx, b.flow, b.request("new", rideInput{Origin: "SF", Amount: 2}))
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeReplayed, out.Kind)
			sql := oneRoundTrip(t)
			require.NotContains(t, sql, "INSERT", "looked up")
			require.Contains(t, sql, "idem_keys k")
		}

		_, err := r.Execute(ctx, b.flow, b.request("another new", rideInput{Origin: "SF", Amount: 4}))
		require.NoError(t, err)
		sqls, _, _ := snapshot()
		require.NotContains(t, sqls[0], "INSERT", "looked up first")
		require.Contains(t, sqls[1], "INSERT", "then inserted")
		_, err = r.Execute(ctx, b.flow, b.request("a third new", rideInput{Origin: "SF", Amount: 4}))
		require.NoError(t, err)
		sqls, _, _ = snapshot()
		require.Contains(t, sqls[0], "INSERT", "inserted first again")
	})
}

// count is how many of sqls are exactly s.
func count(sqls []string, s string) int {
	n := 0
	for _, q := range sqls {
		if q == s {
			n++
		}
	}
	return n
}
