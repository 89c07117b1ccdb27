package idemtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/pgstore"
)

// The wire scenarios break the request's round trips to Postgres, one at a
// time, on the network, where the hook scenarios break the runner's steps.
// The wire baseline runs the request once through a FaultProxy and counts
// its round trips; then, for each wire kind and each round trip N, a
// scenario runs the request on a fresh key through a proxy of its own that
// loses or stalls the reply to round trip N. Every scenario starts from
// fresh connections (made before the request, no statement prepared on
// them), so round trip N is the same statement in every run, unless the
// flow's own statements vary (see Scenario.Missed).
//
// The faulted request must answer within wireAnswerFactor times
// WireTimeout. Then the network heals and the key is driven to its response
// as clients and the server would: the client retries at once; if that
// does not finish the request, the client gives up and, once the key has
// idled, a completer pass takes it; then the retries of settle (with
// Reconcile when the key needs it) until the final response. The invariants
// are those of every scenario.

const (
	// wireAnswerFactor bounds how long a faulted request may take to
	// answer, in WireTimeouts: a stalled reply costs the runner a timeout,
	// and a few more for the round trips it tries after that (re-reading
	// the key, releasing it), each bounded by its StatementTimeout.
	wireAnswerFactor = 10

	// wirePoolConns is the size of the pool through the proxy. A request
	// holds one connection at a time; the store's control statements go
	// through a control pool of its own.
	wirePoolConns = 4
)

// tripMark is how many round trips the wire baseline's request had sent
// when it reached a hook point of its key.
type tripMark struct {
	where HookWhere
	phase string
	sent  int64
}

// wireProcess is a process whose every connection to Postgres goes through
// a fault proxy of its own: a small pool through the proxy, a control pool
// through it too, and a pgstore.Store on them.
type wireProcess struct {
	proxy   *FaultProxy
	pool    *pgxpool.Pool
	control *pgxpool.Pool
	store   *pgstore.Store
}

func (x *explorer[In]) startWire(ctx context.Context) (*wireProcess, error) {
	proxy, err := StartFaultProxy(ctx, x.cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	p := &wireProcess{proxy: proxy}
	url, err := proxy.URL(x.cfg.DatabaseURL)
	var cfg *pgxpool.Config
	if err == nil {
		cfg, err = pgxpool.ParseConfig(url)
	}
	if err == nil {
		cfg.MinConns = 0
		// A liveness ping is a round trip of its own, sent or not depending
		// on how long a connection sat idle: none, so that round trip N is
		// the same statement in every run.
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
		p.pool, err = openWarm(ctx, cfg, wirePoolConns)
	}
	if err == nil {
		p.control, err = openWarm(ctx, cfg, pgstore.ControlConnsDefault)
	}
	if err == nil {
		p.store, err = pgstore.New(p.pool, &pgstore.Config{Schema: x.cfg.Schema, ControlDB: p.control})
	}
	if err != nil {
		return nil, errors.Join(err, p.stop())
	}
	return p, nil
}

// openWarm opens a pool of conns connections on a copy of cfg with one
// connection made: the request's first connection is ready, so that its
// time under WireTimeout is the request's own, not the handshake's
// (authentication can be slow under the race detector). Connecting sends
// no round trip, and the connection has prepared no statement yet.
func openWarm(ctx context.Context, cfg *pgxpool.Config, conns int32) (*pgxpool.Pool, error) {
	cfg = cfg.Copy()
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		pool.Close()
		return nil, err
	}
	conn.Release()
	return pool, nil
}

// stop ends a stall, closes the process's pools, then the proxy, and
// returns once every connection and goroutine of theirs has ended.
func (p *wireProcess) stop() error {
	p.proxy.Resume()
	if p.store != nil {
		p.store.Close()
	}
	for _, pool := range []*pgxpool.Pool{p.control, p.pool} {
		if pool != nil {
			pool.Close()
		}
	}
	return p.proxy.Close()
}

// wireConfig is runnerConfig for a worker whose requests go through the
// proxy: every round trip bounded by WireTimeout.
func (x *explorer[In]) wireConfig(w *worker, now func() time.Time) *idem.Config {
	c := x.runnerConfig(w, now)
	c.StatementTimeout, c.PhaseStatementTimeout = x.cfg.WireTimeout, x.cfg.WireTimeout
	return c
}

// runWireBaseline runs the flow uninterrupted through a proxy, counts its
// round trips and notes which phase each belongs to.
func (x *explorer[In]) runWireBaseline(ctx context.Context) *Scenario {
	sc := x.newScenario(ctx, "wire_baseline", "", "", "the flow runs once, uninterrupted, through the fault proxy, to count the round trips the wire scenarios break one at a time")
	p, err := x.startWire(ctx)
	if err != nil {
		sc.violate("could not start a fault proxy and a pool through it: %v", err)
		return sc.report
	}
	w := sc.newWorker(nil)
	// Count from here: what the process sent while starting (the store's
	// look at the schema) comes before a scenario arms its fault.
	started := p.proxy.Commands()
	w.trips = func() int64 { return p.proxy.Commands() - started }
	out, err := x.callWith(ctx, sc, w, opWire, p.store, x.wireConfig(w, sc.clock.Now))
	trips := int(w.trips())
	if err := p.stop(); err != nil {
		sc.violate("closing the fault proxy: %v", err)
	}
	if out.Kind != idem.OutcomeExecuted || out.Response == nil {
		sc.violate("the uninterrupted run through the fault proxy did not execute: %s; is DatabaseURL the database Pool reaches, can its connections find the flow's tables, and is WireTimeout long enough for its statements?", outcomeText(out, err))
		return sc.report
	}
	sc.step("the request made %s through the proxy", plural(trips, "round trip"))
	x.trips = trips
	sc.mu.Lock()
	x.tripMarks = w.tripMarks
	sc.mu.Unlock()
	x.verify(ctx, sc, out.Response)
	return sc.report
}

// runWireScenarios runs one scenario per wire kind and round trip,
// WireParallelism at a time, and returns them in order: kind by kind, round
// trip by round trip. A scenario that failed while others ran beside it
// runs again, alone, afterwards, and is held to that run: the scenarios
// share the flow's tables, and one whose reply is stalled keeps its
// transaction's row locks until its worker answers, which a flow that
// updates a shared row (a stock, a balance) makes the others wait on past
// their WireTimeout. Faults come one at a time; only the kit's speed-up put
// them side by side.
func (x *explorer[In]) runWireScenarios(ctx context.Context, kinds []Kind) []*Scenario {
	type job struct {
		kind Kind
		n    int
	}
	var jobs []job
	for _, kind := range kinds {
		for n := 1; n <= x.trips; n++ {
			jobs = append(jobs, job{kind, n})
		}
	}
	out := make([]*Scenario, len(jobs))
	slots := make(chan struct{}, x.cfg.WireParallelism)
	var wg sync.WaitGroup
	for i, j := range jobs {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			out[i] = x.runWire(ctx, j.kind, j.n, "")
		})
	}
	wg.Wait()
	if x.cfg.WireParallelism == 1 || len(jobs) == 1 {
		return out
	}
	for i, j := range jobs {
		first := out[i]
		if !first.Failed() || ctx.Err() != nil {
			continue
		}
		again := x.runWire(ctx, j.kind, j.n, "-alone")
		again.RanAlone = true
		again.Steps = append([]string{fmt.Sprintf("run beside other wire scenarios (key %q), it failed: %s; those share the flow's tables, and a stalled one holds its row locks until its worker answers (lock contention), so it ran again alone, on key %q:",
			first.Key, strings.Join(first.Violations, "; "), again.Key)}, again.Steps...)
		out[i] = again
	}
	return out
}

// tripAt says where round trip n of the wire baseline's request was: the
// phase it belongs to, if any, and a phrase for the account.
func (x *explorer[In]) tripAt(n int) (phase, where string) {
	var last *tripMark
	for i := range x.tripMarks {
		if x.tripMarks[i].sent >= int64(n) {
			break
		}
		last = &x.tripMarks[i]
	}
	if last == nil {
		first := ""
		if len(x.phases) > 0 {
			first = x.phases[0]
		}
		return "", fmt.Sprintf("before phase %q began", first)
	}
	switch last.where {
	case HookPhaseStart:
		where = "in phase %q"
	case HookBeforeForeign:
		where = "in phase %q, during its foreign call"
	case HookAfterForeign:
		where = "in phase %q, after its foreign call"
	case HookBeforeCommit:
		where = "the commit of phase %q"
	case HookAfterCommit:
		where = "after phase %q committed"
	default:
		return last.phase, fmt.Sprintf("at %s of phase %q", last.where, last.phase)
	}
	return last.phase, fmt.Sprintf(where, last.phase)
}

func describeWire(kind Kind, n, trips int, where string) string {
	if kind == LostReply {
		return fmt.Sprintf("the reply to round trip %d of %d (%s) is lost after Postgres ran it, and the worker's connection is reset", n, trips, where)
	}
	return fmt.Sprintf("the network stalls as the reply to round trip %d of %d (%s) comes back, after Postgres ran it, until the worker has answered", n, trips, where)
}

// runWire runs the wire scenario of kind at round trip n; suffix, when
// set, makes its key another than the scenario's first run's.
func (x *explorer[In]) runWire(ctx context.Context, kind Kind, n int, suffix string) *Scenario {
	phase, where := x.tripAt(n)
	name := fmt.Sprintf("%s@%d", kind, n)
	sc := x.newScenarioKey(ctx, name, name+suffix, kind, phase, describeWire(kind, n, x.trips, where))
	defer sc.end()
	p, err := x.startWire(ctx)
	if err != nil {
		sc.violate("could not start a fault proxy and a pool through it: %v", err)
		return sc.report
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			if err := p.stop(); err != nil {
				sc.violate("closing the fault proxy: %v", err)
			}
		}
	}
	defer stop()

	var f *Fault
	if kind == LostReply {
		f = p.proxy.LoseReply(Rule{Nth: n})
	} else {
		f = p.proxy.StallReply(Rule{Nth: n})
	}
	r := x.faultedCall(ctx, sc, p, n)
	fired := false
	select {
	case <-f.Done():
		fired = true
	default:
		f.Disarm()
	}
	switch {
	case !fired && x.wentTheBaselinesWay(sc, r.out):
		sc.report.Missed = true
		sc.step("round trip %d never came: this run made fewer round trips than the wire baseline's %d, along the same phases, so nothing was broken", n, x.trips)
	case !fired:
		sc.violate("round trip %d never came: the run through the proxy went another way than the wire baseline's %d round trips (%s); is the flow deterministic for one input, and WireTimeout long enough for a statement here?", n, x.trips, outcomeText(r.out, r.err))
	case kind == LostReply:
		sc.step("the proxy lost the reply to round trip %d and reset worker 1's connection; worker 1 answered in %s", n, r.took.Round(time.Millisecond))
	default:
		sc.step("the proxy held the reply to round trip %d; worker 1 answered in %s; the network resumes", n, r.took.Round(time.Millisecond))
	}
	stop()

	x.commitsNobodySaw(ctx, sc)
	if final := x.settleWire(ctx, sc, r.out, r.err); final != nil {
		x.verify(ctx, sc, final)
	}
	return sc.report
}

// wentTheBaselinesWay reports whether the scenario's first request, whose
// fault never fired, executed and committed the baseline's phases in order:
// it made fewer round trips than the wire baseline without going another
// way. A flow's round trips may vary from run to run where its phases do
// not: River, for one, notifies of an insert only if it has not done so
// for that queue in the last moments.
func (x *explorer[In]) wentTheBaselinesWay(sc *scenario, out *idem.Outcome) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return out.Kind == idem.OutcomeExecuted && slices.Equal(sc.order, x.phases)
}

// wireResult is how the faulted request ended, and how long it took.
type wireResult struct {
	out  *idem.Outcome
	err  error
	took time.Duration
}

// faultedCall makes the scenario's first request, through the proxy, and
// checks that it answers in time. If it does not, the proxy resumes, so
// that the request can end, and if even that does not end it, its context
// is cancelled.
func (x *explorer[In]) faultedCall(ctx context.Context, sc *scenario, p *wireProcess, n int) wireResult {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := sc.newWorker(nil)
	ended := make(chan wireResult, 1)
	began := time.Now()
	go func() {
		out, err := x.callWith(ctx, sc, w, opWire, p.store, x.wireConfig(w, sc.clock.Now))
		ended <- wireResult{out, err, time.Since(began)}
	}()
	bound := wireAnswerFactor * x.cfg.WireTimeout
	limit := time.NewTimer(bound)
	defer limit.Stop()
	select {
	case r := <-ended:
		return r
	case <-limit.C:
	}
	sc.violate("worker 1 had no answer %s after its request began, with round trip %d's reply broken: a request must answer within %d times its statement timeout (WireTimeout %s), whatever the network does", bound, n, wireAnswerFactor, x.cfg.WireTimeout)
	p.proxy.Resume()
	limit.Reset(bound)
	select {
	case r := <-ended:
		return r
	case <-limit.C:
	}
	sc.violate("worker 1 had no answer %s after the network resumed either; its context is cancelled", bound)
	cancel()
	return <-ended
}

// commitsNobodySaw counts the commits the faulted worker made without
// learning it: a phase commit whose reply was held until its worker gave
// up on it (and on re-reading the key) landed all the same, and the key
// says so. Postgres had run the commit when the fault acted, so the key,
// read once the worker answered, is the truth.
func (x *explorer[In]) commitsNobodySaw(ctx context.Context, sc *scenario) {
	rec, err := x.store.GetKey(ctx, sc.scope, sc.report.Key)
	switch {
	case errors.Is(err, idemtype.ErrNotFound):
		return
	case err != nil:
		sc.violate("could not read the key after the faulted request: %v", err)
		return
	}
	landed := x.phases
	if rec.Status != idemtype.StoredFinished {
		landed = x.phases[:slices.Index(x.phases, rec.RecoveryPoint)+1]
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for _, phase := range landed {
		if sc.commits[phase] > 0 {
			continue
		}
		sc.order = append(sc.order, phase)
		sc.commits[phase]++
		sc.report.Steps = append(sc.report.Steps, fmt.Sprintf("the key shows phase %q committed: worker 1's commit landed, though its reply never reached worker 1", phase))
	}
}
