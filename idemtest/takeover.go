package idemtest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/pgstore"
)

// lockPollInterval is how often the takeover scenario asks Postgres whether
// the second worker waits for the first one's locks.
const lockPollInterval = 5 * time.Millisecond

// takeover runs the LeaseTakeover scenario: worker 1 pauses just before it
// commits phase f.phase, its lease runs out, worker 2 takes the key over and
// settles it, and worker 1 resumes. If worker 2 waits for a row lock worker
// 1's open transaction holds, worker 1 resumes then, as a paused process
// that wakes up would, so its refused commit frees the lock.
func (x *explorer[In]) takeover(ctx context.Context, sc *scenario, f *fault) *idemtype.Response {
	// The paused worker's store is the kit's own, on a handle that shows
	// which connection its phase transaction holds.
	conns := &connWatch{DB: x.db}
	pausedStore, err := pgstore.New(conns, &pgstore.Config{Schema: x.cfg.Schema, ControlDB: conns})
	if err != nil {
		sc.violate("could not make the paused worker's store: %v", err)
		return nil
	}
	f.park = &parking{parked: make(chan struct{}), release: make(chan struct{}), conns: conns}
	first := make(chan runResult, 1)
	go func() {
		out, err := x.call(ctx, sc, f, opRun, pausedStore)
		first <- runResult{out, err}
	}()
	var firstEnded *runResult
	defer func() {
		// Never leave the first worker parked, whatever happened.
		f.park.resume()
		if firstEnded == nil {
			<-first
		}
	}()

	select {
	case <-f.park.parked:
	case r := <-first:
		firstEnded = &r
		sc.violate("the fault point was never reached: the first run went another way than the baseline (%s); is the flow deterministic for one input?", outcomeText(r.out, r.err))
		return x.settle(ctx, sc, r.out, r.err)
	}
	sc.step("worker 1 pauses just before phase %q commits, its transaction open", f.phase)
	sc.advance(x.lease+time.Second, "worker 1's lease runs out while it is paused")

	second := make(chan *idemtype.Response, 1)
	go func() { second <- x.settle(ctx, sc, nil, nil) }()
	ticker := time.NewTicker(lockPollInterval)
	defer ticker.Stop()
	resumed := false
	var final *idemtype.Response
wait:
	for {
		select {
		case final = <-second:
			break wait
		case <-ticker.C:
			if resumed {
				continue
			}
			blocked, err := x.blockedBy(ctx, f.park.conns.pid.Load())
			if err != nil {
				sc.violate("idemtest could not ask Postgres about lock waits: %v", err)
			}
			if blocked || err != nil {
				sc.step("the worker that took over waits for a row lock held by worker 1's open transaction; worker 1 resumes")
				f.park.resume()
				resumed = true
			}
		}
	}
	if !resumed {
		sc.step("worker 1 resumes")
		f.park.resume()
	}
	r := <-first
	firstEnded = &r
	if r.out.Kind != idem.OutcomeLockLost || !errors.Is(r.err, idem.ErrLockLost) {
		sc.violate("the paused worker ended with %s, want lock_lost (idem.ErrLockLost): a worker whose key was taken over must not commit", outcomeText(r.out, r.err))
	}
	return final
}

// runResult is how a worker's run ended.
type runResult struct {
	out *idem.Outcome
	err error
}

// blockedBy reports whether any backend waits for a lock that backend pid
// holds. On Citus the locks of a transaction are taken on the workers,
// which the coordinator's pg_locks does not show: there it asks
// citus_lock_waits, which names backends by global pid (the coordinator's
// node id and the pid).
func (x *explorer[In]) blockedBy(ctx context.Context, pid uint32) (bool, error) {
	if pid == 0 {
		return false, nil
	}
	var blocked, citus bool
	err := x.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND $1::int = ANY (pg_blocking_pids(pid))),
		EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`, int64(pid)).Scan(&blocked, &citus)
	if err != nil || blocked || !citus {
		return blocked, err
	}
	err = x.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM citus_lock_waits
		WHERE blocking_gpid = citus_calculate_gpid((SELECT nodeid FROM pg_dist_node WHERE groupid = 0 LIMIT 1), $1::int))`,
		int64(pid)).Scan(&blocked)
	return blocked, err
}

// parking holds the first worker of a takeover scenario.
type parking struct {
	parked  chan struct{}
	release chan struct{}
	once    sync.Once
	frozen  atomic.Pointer[time.Time]
	conns   *connWatch
}

// pause parks the worker until resume, or until its context ends, which
// happens when its heartbeat finds the key taken over. Its clock stops, as
// a paused process's does, so a heartbeat cannot renew its lease.
func (p *parking) pause(ctx context.Context, c *Clock) error {
	now := c.Now()
	p.frozen.Store(&now)
	close(p.parked)
	select {
	case <-p.release:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (p *parking) resume() { p.once.Do(func() { close(p.release) }) }

func (p *parking) clock(c *Clock) func() time.Time {
	return func() time.Time {
		if t := p.frozen.Load(); t != nil {
			return *t
		}
		return c.Now()
	}
}

// connWatch remembers the backend of the connection most recently taken
// from the pool, which for a pgstore.Store is its latest phase transaction's,
// so the kit can ask Postgres whether another worker waits for its locks.
// Reading the pid costs no round trip and leaves the transaction alone.
type connWatch struct {
	pgstore.DB
	pid atomic.Uint32
}

func (w *connWatch) Acquire(ctx context.Context) (*pgxpool.Conn, error) {
	conn, err := w.DB.Acquire(ctx)
	if err == nil {
		w.pid.Store(conn.Conn().PgConn().PID())
	}
	return conn, err
}
