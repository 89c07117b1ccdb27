package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/pgstore"
)

// wireCounter counts what a pool sends, two ways: statements and round
// trips as pgx reports them (a query is one round trip, a batch is one
// pipeline), and flushed writes on the socket, which is what a network
// round trip costs. The two must agree; the socket is the ground truth.
type wireCounter struct {
	mu         sync.Mutex
	statements []string
	roundTrips atomic.Int64
	prepares   atomic.Int64
	writes     atomic.Int64
}

var (
	_ pgx.QueryTracer   = (*wireCounter)(nil)
	_ pgx.BatchTracer   = (*wireCounter)(nil)
	_ pgx.PrepareTracer = (*wireCounter)(nil)
)

func (c *wireCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.roundTrips.Add(1)
	c.addStatement(data.SQL)
	return ctx
}

func (c *wireCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *wireCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.roundTrips.Add(1)
	return ctx
}

func (c *wireCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	c.addStatement(data.SQL)
}

func (c *wireCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (c *wireCounter) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	c.prepares.Add(1)
	return ctx
}

func (c *wireCounter) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

func (c *wireCounter) addStatement(sql string) {
	c.mu.Lock()
	c.statements = append(c.statements, sql)
	c.mu.Unlock()
}

// position is where the counters stand, for differences.
type position struct {
	statements int
	roundTrips int64
	writes     int64
	prepares   int64
}

func (c *wireCounter) position() position {
	c.mu.Lock()
	n := len(c.statements)
	c.mu.Unlock()
	return position{statements: n, roundTrips: c.roundTrips.Load(), writes: c.writes.Load(), prepares: c.prepares.Load()}
}

// span is what was sent between two positions.
type span struct {
	Writes, RoundTrips, Prepares int64
	Statements                   []string
}

func (c *wireCounter) between(from, to position) span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return span{
		Writes: to.writes - from.writes, RoundTrips: to.roundTrips - from.roundTrips, Prepares: to.prepares - from.prepares,
		Statements: append([]string(nil), c.statements[from.statements:to.statements]...),
	}
}

// own counts the flow's business statements in s.
func (s span) own() int64 {
	var n int64
	for _, sql := range s.Statements {
		if strings.Contains(sql, businessMarker) {
			n++
		}
	}
	return n
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// countedPool is a one-connection pool (so its statement cache is warm after
// one pass) whose every statement and socket write is counted.
func countedPool(ctx context.Context, e *env) (*pgxpool.Pool, *wireCounter, error) {
	counter := &wireCounter{}
	dialer := &net.Dialer{}
	pool, err := e.newPool(ctx, 1, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.Tracer = counter
		// A liveness ping after a second idle is the pool's, not the
		// request's; the counted pool never sits idle in production terms.
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &countingConn{Conn: c, writes: &counter.writes}, nil
		}
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
	Prepares     int64
	Acquisition  int64 // round trips before the first phase (runner only)
	Phases       []phaseTrips
	AcquireLimit int64 // target for Acquisition, 0 for none
}

type roundTripReport struct {
	Paths []pathTrips
}

// measureRoundTrips counts round trips for a new key, a replay and an
// in-progress answer, for the runner and both baselines, after warming the
// statement cache of the single counted connection.
func measureRoundTrips(ctx context.Context, e *env) (*roundTripReport, error) {
	pool, counter, err := countedPool(ctx, e)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	store, err := pgstore.New(pool, &pgstore.Config{Schema: e.schema})
	if err != nil {
		return nil, err
	}

	type mark struct {
		where idem.HookWhere
		phase string
		at    position
	}
	var (
		marks     []mark
		measuring bool
		crashKey  string
	)
	flow := newRunnerFlow()
	runner, err := idem.NewRunner(store, &idem.Config{Logger: quietLogger(), Test: idem.TestConfig{Hook: func(_ context.Context, at idem.HookPoint) error {
		if measuring {
			marks = append(marks, mark{at.Where, at.Phase, counter.position()})
		}
		if at.Where == idem.HookAfterCommit && at.Key != nil && at.Key.Key == crashKey {
			// Die holding the key, as a crashed process would: the next
			// request for it is answered "in progress".
			return idem.ErrSimulatedCrash
		}
		return nil
	}}})
	if err != nil {
		return nil, err
	}
	in := rideInput{UserID: 1, Origin: "SF", Amount: 2000}
	req := func(key string) idem.Request {
		return idem.Request{Scope: "user:rt", Key: key, Path: "/rides", Params: in}
	}

	// Warm up: pgx prepares each statement once per connection, a round
	// trip the first time only. Every path runs once.
	if _, err := runner.Run(ctx, flow, req("warm")); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	if _, err := runner.Run(ctx, flow, req("warm")); err != nil {
		return nil, fmt.Errorf("warm-up replay: %w", err)
	}

	rep := &roundTripReport{}
	measure := func(impl, path string, fn func() error) (*pathTrips, error) {
		marks = nil
		measuring = true
		from := counter.position()
		err := fn()
		measuring = false
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", impl, path, err)
		}
		s := counter.between(from, counter.position())
		pt := &pathTrips{Impl: impl, Path: path, Writes: s.Writes, Traced: s.RoundTrips, Statements: len(s.Statements), Prepares: s.Prepares}
		if len(marks) > 0 {
			pt.Acquisition = marks[0].at.writes - from.writes
			var start position
			for _, m := range marks {
				switch m.where {
				case idem.HookPhaseStart:
					start = m.at
				case idem.HookAfterCommit:
					ps := counter.between(start, m.at)
					pt.Phases = append(pt.Phases, phaseTrips{Phase: m.phase, RoundTrips: ps.Writes, Own: ps.own()})
				}
			}
		} else if impl == "runner" {
			pt.Acquisition = s.Writes // nothing ran after the acquisition
		}
		rep.Paths = append(rep.Paths, *pt)
		return pt, nil
	}

	if _, err := measure("runner", "new key", func() error {
		_, err := runner.Run(ctx, flow, req("new"))
		return err
	}); err != nil {
		return nil, err
	}
	if _, err := measure("runner", "replay", func() error {
		out, err := runner.Run(ctx, flow, req("new"))
		if err == nil && out.Kind != idem.OutcomeReplayed {
			err = fmt.Errorf("outcome %s, want replayed", out.Kind)
		}
		return err
	}); err != nil {
		return nil, err
	}
	crashKey = "held"
	if out, err := runner.Run(ctx, flow, req("held")); !errors.Is(err, idem.ErrSimulatedCrash) {
		return nil, fmt.Errorf("leave a key in progress: outcome %v, %w", out.Kind, err)
	}
	crashKey = ""
	if _, err := measure("runner", "in progress", func() error {
		out, err := runner.Run(ctx, flow, req("held"))
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

	// The baselines, on the same counted connection.
	fp, err := baseFingerprint(in)
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO base_keys (scope, key, fingerprint, locked_at) VALUES ('user:rt', 'held', $1, now())`, fp); err != nil {
		return nil, err
	}
	for _, b := range []struct {
		name string
		impl *baseline
	}{{"baseline (pipelined)", &baseline{pool: pool, pipelined: true}}, {"baseline (plain tx)", &baseline{pool: pool}}} {
		key := "new-" + strings.Fields(b.name)[1]
		warm := "warm-" + strings.Fields(b.name)[1]
		if _, err := b.impl.run(ctx, "user:rt", warm, in); err != nil {
			return nil, fmt.Errorf("%s warm-up: %w", b.name, err)
		}
		if _, err := b.impl.run(ctx, "user:rt", warm, in); err != nil {
			return nil, fmt.Errorf("%s warm-up replay: %w", b.name, err)
		}
		if _, err := measure(b.name, "new key", func() error {
			_, err := b.impl.run(ctx, "user:rt", key, in)
			return err
		}); err != nil {
			return nil, err
		}
		if _, err := measure(b.name, "replay", func() error {
			res, err := b.impl.run(ctx, "user:rt", key, in)
			if err == nil && !res.replayed {
				err = errors.New("not replayed")
			}
			return err
		}); err != nil {
			return nil, err
		}
		if _, err := measure(b.name, "in progress", func() error {
			_, err := b.impl.run(ctx, "user:rt", "held", in)
			if !errors.Is(err, errBaselineInProgress) {
				return fmt.Errorf("%v, want in progress", err)
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	return rep, nil
}
