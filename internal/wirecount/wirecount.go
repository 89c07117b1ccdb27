// Package wirecount counts what a pgx connection sends to Postgres, two
// ways: statements and round trips as pgx reports them to a tracer (a query
// is one round trip, a batch is one pipeline), and flushed writes on the
// socket, which is what a network round trip costs. The two should agree;
// the socket is the ground truth.
//
// The runner's round-trip test and cmd/idembench both measure with it, so
// the figure the tests prove and the figure the benchmark reports are
// counted the same way.
package wirecount

import (
	"context"
	"net"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// Counter counts statements, round trips, prepares and socket writes. It is
// safe for concurrent use, but counts are only meaningful on a pool of one
// connection.
type Counter struct {
	mu         sync.Mutex
	statements []string
	roundTrips atomic.Int64
	prepares   atomic.Int64
	writes     atomic.Int64
}

var (
	_ pgx.QueryTracer   = (*Counter)(nil)
	_ pgx.BatchTracer   = (*Counter)(nil)
	_ pgx.PrepareTracer = (*Counter)(nil)
)

// Install makes cfg's connections counted by a new Counter: it becomes the
// tracer, and the dialer (cfg's own, or a plain net.Dialer) is wrapped to
// count socket writes.
func Install(cfg *pgx.ConnConfig) *Counter {
	c := &Counter{}
	cfg.Tracer = c
	dial := cfg.DialFunc
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: conn, writes: &c.writes}, nil
	}
	return c
}

// Position is where the counters stand, for differences (see Between).
type Position struct {
	Statements int
	RoundTrips int64
	Writes     int64
	Prepares   int64
}

// Position returns where the counters stand now.
func (c *Counter) Position() Position {
	c.mu.Lock()
	n := len(c.statements)
	c.mu.Unlock()
	return Position{Statements: n, RoundTrips: c.roundTrips.Load(), Writes: c.writes.Load(), Prepares: c.prepares.Load()}
}

// Span is what was sent between two positions.
type Span struct {
	Writes     int64 // flushed socket writes: round trips on the wire
	RoundTrips int64 // round trips as the tracer saw them
	Prepares   int64
	Statements []string
}

// Between returns what was sent from one position to a later one.
func (c *Counter) Between(from, to Position) Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Span{
		Writes: to.Writes - from.Writes, RoundTrips: to.RoundTrips - from.RoundTrips, Prepares: to.Prepares - from.Prepares,
		Statements: append([]string(nil), c.statements[from.Statements:to.Statements]...),
	}
}

// TraceQueryStart implements pgx.QueryTracer.
func (c *Counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.roundTrips.Add(1)
	c.addStatement(data.SQL)
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (c *Counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart implements pgx.BatchTracer.
func (c *Counter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.roundTrips.Add(1)
	return ctx
}

// TraceBatchQuery implements pgx.BatchTracer.
func (c *Counter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	c.addStatement(data.SQL)
}

// TraceBatchEnd implements pgx.BatchTracer.
func (c *Counter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TracePrepareStart implements pgx.PrepareTracer.
func (c *Counter) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	c.prepares.Add(1)
	return ctx
}

// TracePrepareEnd implements pgx.PrepareTracer.
func (c *Counter) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

func (c *Counter) addStatement(sql string) {
	c.mu.Lock()
	c.statements = append(c.statements, sql)
	c.mu.Unlock()
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}
