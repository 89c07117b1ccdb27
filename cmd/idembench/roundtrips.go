package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/internal/wirecount"
)

// own counts the flow's business statements in s.
func own(s wirecount.Span) int64 {
	var n int64
	for _, sql := range s.Statements {
		if strings.Contains(sql, businessMarker) {
			n++
		}
	}
	return n
}

// transactions counts the transactions that statements, sent in order on
// one connection, ran in: each BEGIN ... COMMIT (or ROLLBACK) is one, and so
// is every statement sent outside one (an implicit transaction, which
// commits on its own).
func transactions(statements []string) int {
	n, open := 0, false
	for _, sql := range statements {
		word, _, _ := strings.Cut(strings.ToLower(strings.TrimSpace(sql)), " ")
		switch {
		case word == "begin" || word == "start":
			open = true
		case open && (word == "commit" || word == "rollback" || word == "end" || word == "abort"):
			open = false
			n++
		case !open:
			n++
		}
	}
	return n
}

// countedPool is a one-connection pool (so its statement cache is warm after
// one pass) whose every statement and socket write is counted.
func countedPool(ctx context.Context, e *env) (*pgxpool.Pool, *wirecount.Counter, error) {
	var counter *wirecount.Counter
	pool, err := e.newPool(ctx, 1, func(cfg *pgxpool.Config) {
		counter = wirecount.Install(cfg.ConnConfig)
		// A liveness ping after a second idle is the pool's, not the
		// request's; the counted pool never sits idle in production terms.
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	})
	return pool, counter, err
}

// phaseTrips is one phase's cost on the wire.
type phaseTrips struct {
	Phase      string
	RoundTrips int64 // socket writes
	Own        int64 // the phase's own statements
}

// pathTrips is one request path's cost on the wire.
type pathTrips struct {
	Impl, Path   string
	Writes       int64 // socket writes: round trips on the wire
	Traced       int64 // round trips as pgx's tracer saw them
	Statements   int
	Transactions int // see transactions
	Prepares     int64
	Acquisition  int64 // round trips before the first phase (runner only)
	Phases       []phaseTrips
	AcquireLimit int64 // target for Acquisition, 0 for none
}

type roundTripReport struct {
	Paths []pathTrips
}

// measureRoundTrips counts round trips for a new key, a replay and an
// in-progress answer, for the runner, the baselines and the
// single-transaction contender, after warming the
// statement cache of the single counted connection.
func measureRoundTrips(ctx context.Context, e *env) (*roundTripReport, error) {
	pool, counter, err := countedPool(ctx, e)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	type mark struct {
		where idemtest.HookWhere
		phase string
		at    wirecount.Position
	}
	var (
		marks     []mark
		measuring bool
		crashKey  string
	)
	flow := newRunnerFlow()
	runner, store, err := newRunner(pool, e.schema, idem.Config{Test: idemtest.WithHook(idem.TestConfig{}, func(_ context.Context, at idemtest.HookPoint) error {
		if measuring {
			marks = append(marks, mark{at.Where, at.Phase, counter.Position()})
		}
		if at.Where == idemtest.HookAfterCommit && at.Key != nil && at.Key.Key == crashKey {
			// Die holding the key, as a crashed process would: the next
			// request for it is answered "in progress".
			return idemtest.ErrSimulatedCrash
		}
		return nil
	})})
	if err != nil {
		return nil, err
	}
	defer store.Close()
	in := rideInput{UserID: 1, Origin: "SF", Amount: 2000}
	req := func(key string) idem.Request {
		return idem.Request{Scope: "user:rt", Key: key, Path: "/rides", Params: in}
	}

	// Warm up: pgx prepares each statement once per connection, a round
	// trip the first time only. Every path runs once.
	if _, err := runner.Execute(ctx, flow, req("warm")); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	if _, err := runner.Execute(ctx, flow, req("warm")); err != nil {
		return nil, fmt.Errorf("warm-up replay: %w", err)
	}

	rep := &roundTripReport{}
	measure := func(impl, path string, fn func() error) (*pathTrips, error) {
		marks = nil
		measuring = true
		from := counter.Position()
		err := fn()
		measuring = false
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", impl, path, err)
		}
		s := counter.Between(from, counter.Position())
		pt := &pathTrips{Impl: impl, Path: path, Writes: s.Writes, Traced: s.RoundTrips, Statements: len(s.Statements),
			Transactions: transactions(s.Statements), Prepares: s.Prepares}
		if len(marks) > 0 {
			pt.Acquisition = marks[0].at.Writes - from.Writes
			var start wirecount.Position
			for _, m := range marks {
				switch m.where {
				case idemtest.HookPhaseStart:
					start = m.at
				case idemtest.HookAfterCommit:
					ps := counter.Between(start, m.at)
					pt.Phases = append(pt.Phases, phaseTrips{Phase: m.phase, RoundTrips: ps.Writes, Own: own(ps)})
				}
			}
		} else if impl == "runner" {
			pt.Acquisition = s.Writes // nothing ran after the acquisition
		}
		rep.Paths = append(rep.Paths, *pt)
		return pt, nil
	}

	if _, err := measure("runner", "new key", func() error {
		_, err := runner.Execute(ctx, flow, req("new"))
		return err
	}); err != nil {
		return nil, err
	}
	if _, err := measure("runner", "replay", func() error {
		return execute(ctx, runner, flow, "user:rt", "new", in, idem.OutcomeReplayed)
	}); err != nil {
		return nil, err
	}
	crashKey = "held"
	if out, err := runner.Execute(ctx, flow, req("held")); !errors.Is(err, idemtest.ErrSimulatedCrash) {
		return nil, fmt.Errorf("leave a key in progress: outcome %v, %w", out.Kind, err)
	}
	crashKey = ""
	if _, err := measure("runner", "in progress", func() error {
		out, err := runner.Execute(ctx, flow, req("held"))
		if !errors.Is(err, idem.ErrInProgress) {
			return fmt.Errorf("outcome %s (%w), want in progress", out.Kind, err)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	for i := range rep.Paths {
		rep.Paths[i].AcquireLimit = 1
	}

	// The hand-rolled implementations, on the same counted connection,
	// each with a key of its own left in progress.
	fp, err := baseFingerprint(in)
	if err != nil {
		return nil, err
	}
	for _, table := range []string{"base_keys", "single_keys"} {
		if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (scope, key, fingerprint, locked_at) VALUES ('user:rt', 'held', $1, now())`, fp); err != nil {
			return nil, err
		}
	}
	for _, b := range []struct {
		name, tag string
		run       func(ctx context.Context, scope, key string, in rideInput) (*baseResult, error)
	}{
		{"baseline (pipelined)", "pipelined", (&baseline{pool: pool, pipelined: true}).run},
		{"single tx", "single", (&single{pool: pool}).run},
		{"baseline (plain tx)", "plain", (&baseline{pool: pool}).run},
	} {
		key, warm := "new-"+b.tag, "warm-"+b.tag
		if _, err := b.run(ctx, "user:rt", warm, in); err != nil {
			return nil, fmt.Errorf("%s warm-up: %w", b.name, err)
		}
		if _, err := b.run(ctx, "user:rt", warm, in); err != nil {
			return nil, fmt.Errorf("%s warm-up replay: %w", b.name, err)
		}
		if _, err := measure(b.name, "new key", func() error {
			_, err := b.run(ctx, "user:rt", key, in)
			return err
		}); err != nil {
			return nil, err
		}
		if _, err := measure(b.name, "replay", func() error {
			res, err := b.run(ctx, "user:rt", key, in)
			if err == nil && !res.replayed {
				err = errors.New("not replayed")
			}
			return err
		}); err != nil {
			return nil, err
		}
		if _, err := measure(b.name, "in progress", func() error {
			_, err := b.run(ctx, "user:rt", "held", in)
			if !errors.Is(err, errKeyInProgress) {
				return fmt.Errorf("%v, want in progress", err)
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	return rep, nil
}
