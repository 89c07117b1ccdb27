package idemtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/pgstore"
)

// Explore runs the flow once uninterrupted, then once per crash point of
// that run (see Kind), each on a fresh key, and checks every invariant after
// each. It logs a summary line with the number of scenarios, and fails t
// with the account of the first failed scenario. It returns the report.
//
//	func TestCreateOrder(t *testing.T) {
//		t.Parallel()
//		idemtest.Explore(t, idemtest.Config[orders.Params]{
//			Pool: pool, Flow: orders.NewFlow(payments), Input: orders.Params{SKU: "rocket", Quantity: 2},
//			Compare: idemtest.EqualJSON("id", "charge_id"),
//			Check:   exactlyOneOrderAndOneCharge,
//		})
//	}
//
// Explore is safe under t.Parallel: faults are injected through each
// runner's own Config.Test hooks and clock, never through global state.
func Explore[In any](t testing.TB, cfg Config[In]) *Report {
	t.Helper()
	rep, err := ExploreContext(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
		return nil
	}
	t.Log(rep.Summary())
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	return rep
}

// ExploreContext is Explore without a testing.TB: it returns the report, whose Err
// says whether a scenario failed. The error is for an unusable Config.
func ExploreContext[In any](ctx context.Context, cfg Config[In]) (*Report, error) {
	started := time.Now()
	cfg, store, db, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	x := &explorer[In]{cfg: cfg, store: store, db: db, runID: randomID()}
	if cfg.Runner != nil {
		x.base = *cfg.Runner
	}
	x.userHook, x.base.Test = x.base.Test.Hook, idem.TestConfig{}
	x.lease = x.base.WithDefaults().Lease
	if _, err := idem.NewRunner(store, x.runnerConfig(nil, nil)); err != nil {
		return nil, fmt.Errorf("%w: Runner: %w", ErrInvalidConfig, err)
	}

	rep := &Report{Flow: cfg.Flow.Name()}
	defer func() { rep.Elapsed = time.Since(started) }()
	rep.Baseline = x.runBaseline(ctx)
	if rep.Baseline.Failed() {
		return rep, nil
	}
	rep.Phases, rep.ForeignPhases = x.phases, x.foreignPhases()
	for _, name := range cfg.Flow.PhaseNames() {
		if !slices.Contains(x.phases, name) {
			rep.Unreached = append(rep.Unreached, name)
		}
	}
	for _, phase := range x.phases {
		for _, kind := range cfg.Kinds {
			foreign, hasForeign := x.foreign[phase]
			if kind == CrashAfterForeign && !hasForeign {
				continue
			}
			rep.Scenarios = append(rep.Scenarios, x.runScenario(ctx, kind, phase, foreign.name))
		}
	}
	return rep, nil
}

// explorer holds one exploration's settings and what the baseline taught it.
type explorer[In any] struct {
	cfg      Config[In]
	store    idemdriver.Store
	db       pgstore.DB
	base     idem.Config
	userHook func(context.Context, idem.HookPoint) error
	lease    time.Duration
	runID    string

	// From the baseline: the phases it committed, in order, and its foreign
	// calls by phase.
	phases   []string
	foreign  map[string]foreignCall
	response *idem.Response
}

func (x *explorer[In]) foreignPhases() []string {
	var out []string
	for _, p := range x.phases {
		if _, ok := x.foreign[p]; ok {
			out = append(out, p)
		}
	}
	return out
}

var discardLogger = slog.New(slog.DiscardHandler)

// runnerConfig is the base config wired to worker w and clock now.
func (x *explorer[In]) runnerConfig(w *worker, now func() time.Time) *idem.Config {
	c := x.base
	c.Flows = append([]idem.AnyFlow(nil), x.base.Flows...)
	if !slices.ContainsFunc(c.Flows, func(f idem.AnyFlow) bool { return f != nil && f.Name() == x.cfg.Flow.Name() }) {
		c.Flows = append(c.Flows, x.cfg.Flow)
	}
	if c.Logger == nil {
		c.Logger = discardLogger
	}
	if w != nil {
		c.Test = idem.TestConfig{Now: now, Hook: w.hook}
		c.Observer = observerFor(w, x.base.Observer)
	}
	return &c
}

func (x *explorer[In]) newScenario(name string, kind Kind, phase, description string) *scenario {
	start := time.Now().UTC().Truncate(time.Microsecond)
	return &scenario{
		report:   &Scenario{Name: name, Kind: kind, Phase: phase, Description: description, Key: "idemtest-" + x.runID + "-" + name},
		scope:    x.cfg.Scope,
		userHook: x.userHook,
		clock:    NewClock(start),
		commits:  map[string]int{},
		notDone:  map[string]int{},
		marks:    x.providerMarks(),
	}
}

func (x *explorer[In]) providerMarks() []int {
	marks := make([]int, len(x.cfg.Providers))
	for i, p := range x.cfg.Providers {
		marks[i] = callMark(p)
	}
	return marks
}

// runBaseline runs the flow uninterrupted and learns its path from it.
func (x *explorer[In]) runBaseline(ctx context.Context) *Scenario {
	sc := x.newScenario("baseline", "", "", "the flow runs once, uninterrupted, to give the path and the response every scenario is held to")
	out, err := x.call(ctx, sc, nil, opRun, x.store)
	if out.Kind != idem.OutcomeExecuted || out.Response == nil {
		sc.violate("the uninterrupted run did not execute: %s", outcomeText(out, err))
		return sc.report
	}
	x.phases = append([]string(nil), sc.order...)
	x.foreign = map[string]foreignCall{}
	for _, c := range sc.calls {
		if _, seen := x.foreign[c.phase]; !seen {
			x.foreign[c.phase] = c
		}
	}
	x.response = out.Response
	x.verify(ctx, sc, out.Response)
	return sc.report
}

func (x *explorer[In]) runScenario(ctx context.Context, kind Kind, phase, foreign string) *Scenario {
	sc := x.newScenario(string(kind)+"@"+phase, kind, phase, kind.describe(phase, foreign))
	f := &fault{kind: kind, phase: phase, bypass: x.newBypassWatch(kind)}
	var final *idem.Response
	if kind == LeaseTakeover {
		final = x.takeover(ctx, sc, f)
	} else {
		out, err := x.call(ctx, sc, f, opRun, x.store)
		f.bypass.check(ctx, sc, phase) // see bypass.go
		if !f.fired {
			sc.violate("the fault point was never reached: the first run went another way than the baseline (%s); is the flow deterministic for one input?", outcomeText(out, err))
		}
		final = x.settle(ctx, sc, out, err)
	}
	if final != nil {
		x.verify(ctx, sc, final)
	}
	return sc.report
}

// settle retries the scenario's key, as clients, the completer and
// operators would, until it reaches a final response: a crashed worker's
// lease is made to expire, a failed attempt is retried, a key in
// needs_reconcile is reconciled. A nil out starts with a run.
func (x *explorer[In]) settle(ctx context.Context, sc *scenario, out *idem.Outcome, err error) *idem.Response {
	if out == nil {
		out, err = x.call(ctx, sc, nil, opRun, x.store)
	}
	for retries := 0; ; retries++ {
		if out.Kind == idem.OutcomeExecuted || out.Kind == idem.OutcomeReplayed {
			if out.Response == nil {
				sc.violate("outcome %s came without a response", out.Kind)
			}
			return out.Response
		}
		switch {
		case out.Kind == idem.OutcomeInvalid || out.Kind == idem.OutcomeMismatch:
			sc.violate("a retry of the same request got %s", outcomeText(out, err))
			return nil
		case retries == x.cfg.MaxAttempts:
			sc.violate("no final outcome after %d retries; the last: %s", retries, outcomeText(out, err))
			return nil
		case ctx.Err() != nil:
			sc.violate("gave up retrying: %v", context.Cause(ctx))
			return nil
		}
		switch out.Kind {
		case idem.OutcomeAbandoned:
			sc.advance(x.lease+time.Second, "the dead worker's lease runs out")
		case idem.OutcomeInProgress:
			sc.advance(x.lease+time.Second, "the lease holding the key runs out")
		}
		op := opRun
		if out.Kind == idem.OutcomeNeedsReconcile || (out.Record != nil && out.Record.Status == idem.StatusNeedsReconcile) {
			op = opReconcile
		}
		out, err = x.call(ctx, sc, nil, op, x.store)
	}
}

// lockPollInterval is how often the takeover scenario asks Postgres whether
// the second worker waits for the first one's locks.
const lockPollInterval = 5 * time.Millisecond

// takeover runs the LeaseTakeover scenario: worker 1 pauses just before it
// commits phase f.phase, its lease runs out, worker 2 takes the key over and
// settles it, and worker 1 resumes. If worker 2 waits for a row lock worker
// 1's open transaction holds, worker 1 resumes then, as a paused process
// that wakes up would, so its refused commit frees the lock.
func (x *explorer[In]) takeover(ctx context.Context, sc *scenario, f *fault) *idem.Response {
	// The paused worker's store is the kit's own, on a handle that shows
	// which connection its phase transaction holds.
	conns := &connWatch{DB: x.db}
	pausedStore, err := pgstore.New(conns, &pgstore.Config{Schema: x.cfg.Schema, ControlDB: conns})
	if err != nil {
		sc.violate("could not make the paused worker's store: %v", err)
		return nil
	}
	f.park = &parking{parked: make(chan struct{}), release: make(chan struct{}), conns: conns}
	type result struct {
		out *idem.Outcome
		err error
	}
	first := make(chan result, 1)
	go func() {
		out, err := x.call(ctx, sc, f, opRun, pausedStore)
		first <- result{out, err}
	}()
	var firstEnded *result
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

	second := make(chan *idem.Response, 1)
	go func() { second <- x.settle(ctx, sc, nil, nil) }()
	ticker := time.NewTicker(lockPollInterval)
	defer ticker.Stop()
	resumed := false
	var final *idem.Response
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

// blockedBy reports whether any backend waits for a lock that backend pid
// holds.
func (x *explorer[In]) blockedBy(ctx context.Context, pid uint32) (bool, error) {
	if pid == 0 {
		return false, nil
	}
	var blocked bool
	err := x.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND $1::int = ANY (pg_blocking_pids(pid)))`, int64(pid)).Scan(&blocked)
	return blocked, err
}

type op string

const (
	opRun       op = "Execute"
	opReconcile op = "Reconcile"
)

// call makes one attempt on the scenario's key with a new runner, as a new
// process would, and records what happened as a step. The outcome is never
// nil.
func (x *explorer[In]) call(ctx context.Context, sc *scenario, f *fault, o op, store idemdriver.Store) (*idem.Outcome, error) {
	w := sc.newWorker(f)
	now := sc.clock.Now
	if f != nil && f.park != nil {
		now = f.park.clock(sc.clock)
	}
	r, err := idem.NewRunner(store, x.runnerConfig(w, now))
	if err != nil {
		sc.violate("could not make a runner: %v", err)
		return &idem.Outcome{Kind: idem.OutcomeInvalid}, err
	}
	var out *idem.Outcome
	switch o {
	case opRun:
		out, err = r.Execute(ctx, x.cfg.Flow, idem.Request{Scope: sc.scope, Key: sc.report.Key, Path: x.cfg.Path, Params: x.cfg.Input})
	case opReconcile:
		out, err = r.Reconcile(ctx, sc.scope, sc.report.Key)
	}
	if out == nil {
		out = &idem.Outcome{Kind: idem.OutcomeFailed}
	}
	sc.workerStep(w.n, w.describe(o, out, err))
	return out, err
}

// verify checks a settled scenario's invariants.
func (x *explorer[In]) verify(ctx context.Context, sc *scenario, final *idem.Response) {
	sc.step("final response: %d %s", final.Status, quoteBody(final.Body))

	out, err := x.call(ctx, sc, nil, opRun, x.store)
	switch {
	case out.Kind != idem.OutcomeReplayed || out.Response == nil:
		sc.violate("a retry after the final response got %s, want a replay", outcomeText(out, err))
	case out.Response.Status != final.Status || !bytes.Equal(out.Response.Body, final.Body):
		sc.violate("the replay (%d %s) differs from the final response (%d %s)", out.Response.Status, quoteBody(out.Response.Body), final.Status, quoteBody(final.Body))
	}
	if sc.report.Name != "baseline" {
		if err := x.cfg.Compare(x.response, final); err != nil {
			sc.violate("the final response is not the uninterrupted run's: %v", err)
		}
	}

	rec, err := x.store.GetKey(ctx, sc.scope, sc.report.Key)
	switch {
	case err != nil:
		sc.violate("could not read the key: %v", err)
	case rec.Status != idem.StatusFinished || rec.RecoveryPoint != idem.RecoveryPointFinished:
		sc.violate("the key is %s at recovery point %q, want finished", rec.Status, rec.RecoveryPoint)
	case rec.ForeignMark != "" || rec.LockedAt != nil:
		sc.violate("the finished key still has a foreign mark %q or a lock (locked at %v)", rec.ForeignMark, rec.LockedAt)
	}

	x.checkCommits(sc)
	x.checkForeignCalls(sc)
	x.checkProviders(sc)

	if x.cfg.Check != nil && rec != nil {
		if err := x.cfg.Check(ctx, rec); err != nil {
			if sc.report.Name == "baseline" {
				sc.violate("Check fails on the uninterrupted run, so it or the flow is wrong before any fault: %v", err)
			} else {
				sc.violate("Check: %v", err)
			}
		}
	}
}

// checkCommits: every phase of the path committed exactly once, whether by
// the phase itself or by its reconcile hook, and no other phase did.
func (x *explorer[In]) checkCommits(sc *scenario) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for _, p := range x.phases {
		if n := sc.commits[p]; n != 1 {
			sc.violateLocked("phase %q committed %d times, want exactly once", p, n)
		}
	}
	for _, p := range sc.order {
		if !slices.Contains(x.phases, p) {
			sc.violateLocked("phase %q committed, but the uninterrupted run never ran it", p)
		}
	}
}

// checkForeignCalls: every phase that called out in the baseline called out
// here; an idempotent call used one downstream key throughout (duplicates
// with that key are the provider's to deduplicate); no two phases shared a
// key. Repeated not-idempotent calls are caught as they happen.
func (x *explorer[In]) checkForeignCalls(sc *scenario) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	keysByPhase := map[string][]string{}
	phaseByKey := map[string]string{}
	for _, c := range sc.calls {
		if !slices.Contains(keysByPhase[c.phase], c.key) {
			keysByPhase[c.phase] = append(keysByPhase[c.phase], c.key)
		}
		if other, ok := phaseByKey[c.key]; ok && other != c.phase {
			sc.violateLocked("phases %q and %q sent the same downstream key %q", other, c.phase, c.key)
		}
		phaseByKey[c.key] = c.phase
	}
	for _, p := range x.phases {
		base, ok := x.foreign[p]
		if !ok {
			continue
		}
		keys := keysByPhase[p]
		switch {
		case len(keys) == 0:
			sc.violateLocked("phase %q never made its foreign call %q, which the uninterrupted run made", p, base.name)
		case len(keys) > 1 && base.kind == idem.ForeignIdempotent:
			sc.violateLocked("phase %q sent its foreign call %q with %d different downstream keys (%s); the provider can only deduplicate calls that share one", p, base.name, len(keys), strings.Join(keys, ", "))
		}
	}
}

// checkProviders: every call the registered providers received during the
// scenario carried a key the runner handed out in it, and every idempotent
// call's key reached one of them.
func (x *explorer[In]) checkProviders(sc *scenario) {
	if len(x.cfg.Providers) == 0 {
		return
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	handed := map[string]bool{}
	for _, c := range sc.calls {
		handed[c.key] = true
	}
	received := map[string]bool{}
	reported := map[string]bool{}
	for i, p := range x.cfg.Providers {
		for _, c := range callsSince(p, sc.marks[i]) {
			received[c.Key] = true
			if handed[c.Key] || reported[c.Key] {
				continue
			}
			reported[c.Key] = true
			key := fmt.Sprintf("key %q", c.Key)
			if c.Key == "" {
				key = "no idempotency key"
			}
			sc.violateLocked("provider %d received a call for %q with %s, which is no downstream key the runner handed out in this scenario: a foreign call made outside Attempt.Foreign, or one that does not send the key it is given", i, c.Subject, key)
		}
	}
	for _, c := range sc.calls {
		if c.kind == idem.ForeignIdempotent && !received[c.key] {
			sc.violateLocked("the foreign call %q of phase %q was handed key %q, but no provider received it", c.name, c.phase, c.key)
			received[c.key] = true // once per key
		}
	}
}

// scenario is the live state of one scenario; report is what it tells.
type scenario struct {
	report   *Scenario
	scope    string
	userHook func(context.Context, idem.HookPoint) error
	clock    *Clock
	marks    []int

	mu      sync.Mutex
	workers int
	commits map[string]int // phase -> commits, by the phase or its reconcile hook
	order   []string       // phases in the order they first committed
	notDone map[string]int // phase -> reconcile verdicts of not done
	calls   []foreignCall

	// The last worker step, to fold repeats into it.
	lastCall        string
	lastCallStep    int
	lastCallRepeats int
}

type foreignCall struct {
	worker int
	phase  string
	name   string
	key    string
	kind   idem.ForeignKind
}

func (sc *scenario) newWorker(f *fault) *worker {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.workers++
	return &worker{sc: sc, n: sc.workers, fault: f}
}

func (sc *scenario) step(format string, args ...any) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.report.Steps = append(sc.report.Steps, fmt.Sprintf(format, args...))
}

// workerStep records worker n's call. Calls that went exactly like the
// previous step's (a retry loop that makes no progress) share its line.
func (sc *scenario) workerStep(n int, call string) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	steps := sc.report.Steps
	if len(steps) > 0 && sc.lastCall == call && sc.lastCallStep == len(steps)-1 {
		sc.lastCallRepeats++
		steps[len(steps)-1] = fmt.Sprintf("workers %d to %d, %d alike: %s", n-sc.lastCallRepeats+1, n, sc.lastCallRepeats, call)
		return
	}
	sc.report.Steps = append(steps, fmt.Sprintf("worker %d %s", n, call))
	sc.lastCall, sc.lastCallStep, sc.lastCallRepeats = call, len(sc.report.Steps)-1, 1
}

func (sc *scenario) violate(format string, args ...any) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.violateLocked(format, args...)
}

func (sc *scenario) violateLocked(format string, args ...any) {
	sc.report.Violations = append(sc.report.Violations, fmt.Sprintf(format, args...))
}

func (sc *scenario) advance(d time.Duration, why string) {
	sc.clock.Advance(d)
	sc.step("clock +%s: %s", d, why)
}

// commit counts a commit of phase by worker w. Call with sc.mu held.
func (sc *scenario) commitLocked(w *worker, phase, how string) {
	if sc.commits[phase] == 0 {
		sc.order = append(sc.order, phase)
	}
	sc.commits[phase]++
	w.notes = append(w.notes, "committed "+phase+how)
}

// worker is one runner making one call: a process of its own.
type worker struct {
	sc    *scenario
	n     int
	fault *fault

	// Guarded by sc.mu.
	notes []string
}

func (w *worker) hook(ctx context.Context, at idem.HookPoint) error {
	ours := at.Key != nil && at.Key.Scope == w.sc.scope && at.Key.Key == w.sc.report.Key
	if ours {
		// Record first: what happened happened, whatever the user's hook
		// then decides.
		if at.Where == idem.HookAfterForeign {
			w.foreignCall(at)
		}
	}
	if w.sc.userHook != nil {
		if err := w.sc.userHook(ctx, at); err != nil {
			return err
		}
	}
	f := w.fault
	if !ours {
		return nil
	}
	if f != nil && !f.fired && at.Phase == f.phase {
		f.bypass.note(ctx, at.Where) // see bypass.go
	}
	if f == nil || f.fired || at.Phase != f.phase || at.Where != f.kind.where() {
		return nil
	}
	f.fired = true
	return f.inject(ctx, w)
}

func (w *worker) observe(e idem.Event) {
	if e.Scope != w.sc.scope || e.Key != w.sc.report.Key {
		return
	}
	sc := w.sc
	sc.mu.Lock()
	defer sc.mu.Unlock()
	switch e.Kind {
	case idem.EventPhaseCommitted:
		sc.commitLocked(w, e.Phase, "")
	case idem.EventReconciled:
		switch e.Verdict {
		case "done":
			// The runner committed the phase in the hook's stead; its
			// EventPhaseCommitted counted it.
			w.notes = append(w.notes, "reconcile verdict for "+e.Phase+": done")
		case "not_done":
			sc.notDone[e.Phase]++
			w.notes = append(w.notes, "reconcile verdict for "+e.Phase+": not done, so the phase runs again")
		default:
			w.notes = append(w.notes, fmt.Sprintf("the reconcile hook of %s gave no verdict: %v", e.Phase, e.Err))
		}
	}
}

func (w *worker) foreignCall(at idem.HookPoint) {
	sc := w.sc
	sc.mu.Lock()
	defer sc.mu.Unlock()
	c := foreignCall{worker: w.n, phase: at.Phase, name: at.Foreign, key: at.DownstreamKey, kind: at.ForeignKind}
	sc.calls = append(sc.calls, c)
	if c.kind == idem.ForeignNotIdempotent {
		w.notes = append(w.notes, fmt.Sprintf("made the not-idempotent call %q of %s", c.name, c.phase))
		n := 0
		for _, other := range sc.calls {
			if other.phase == c.phase && other.kind == idem.ForeignNotIdempotent {
				n++
			}
		}
		if n > 1+sc.notDone[c.phase] {
			sc.violateLocked("the not-idempotent foreign call %q of phase %q ran %d times with %d reconcile verdicts of not done between: it was repeated blindly", c.name, c.phase, n, sc.notDone[c.phase])
		}
		return
	}
	w.notes = append(w.notes, fmt.Sprintf("called %q of %s with key %s", c.name, c.phase, c.key))
}

// describe is the worker's call as a step, without the worker's number.
func (w *worker) describe(o op, out *idem.Outcome, err error) string {
	w.sc.mu.Lock()
	defer w.sc.mu.Unlock()
	var b strings.Builder
	b.WriteString(string(o))
	for _, n := range w.notes {
		b.WriteString("; " + n)
	}
	b.WriteString(" -> " + outcomeText(out, err))
	return b.String()
}

func outcomeText(out *idem.Outcome, err error) string {
	s := string(out.Kind)
	if out.Response != nil {
		s += fmt.Sprintf(" %d", out.Response.Status)
	}
	if out.TookOver {
		s += " (took over)"
	}
	if err != nil {
		s += ": " + err.Error()
	}
	return s
}

// errLostAck is what the kit makes a worker see after its commit succeeded.
var errLostAck = errors.New("idemtest: connection lost before the commit acknowledgement arrived")

// fault is what a scenario does to its first worker, once.
type fault struct {
	kind  Kind
	phase string
	// fired is set on the worker's goroutine and read after its call
	// returned.
	fired  bool
	park   *parking
	bypass *bypassWatch
}

func (f *fault) inject(ctx context.Context, w *worker) error {
	note := func(s string) {
		w.sc.mu.Lock()
		defer w.sc.mu.Unlock()
		w.notes = append(w.notes, s)
	}
	switch f.kind {
	case CrashBeforeCommit, CrashAfterForeign, CrashAfterCommit:
		note(fmt.Sprintf("dies at %s of %s", f.kind.where(), f.phase))
		return idem.ErrSimulatedCrash
	case LostCommitAck:
		note("loses the commit acknowledgement of " + f.phase)
		return errLostAck
	case SerializationFailure:
		note("serialization failure injected at " + string(f.kind.where()) + " of " + f.phase)
		return &pgconn.PgError{Severity: "ERROR", Code: "40001", Message: "idemtest: injected serialization failure"}
	case LeaseTakeover:
		note("paused at " + string(f.kind.where()) + " of " + f.phase)
		return f.park.pause(ctx, w.sc.clock)
	}
	return nil
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

// observerFor records events for w and passes them on to the user's
// observer, keeping its Tracer side if it has one.
func observerFor(w *worker, user idem.Observer) idem.Observer {
	o := &recordingObserver{w: w, user: user}
	if t, ok := user.(idem.Tracer); ok {
		return &recordingTracer{recordingObserver: o, tracer: t}
	}
	return o
}

type recordingObserver struct {
	w    *worker
	user idem.Observer
}

func (o *recordingObserver) Observe(ctx context.Context, e idem.Event) {
	o.w.observe(e)
	if o.user != nil {
		o.user.Observe(ctx, e)
	}
}

type recordingTracer struct {
	*recordingObserver
	tracer idem.Tracer
}

func (t *recordingTracer) StartRequest(ctx context.Context, flow, scope string) (context.Context, func(*idem.Outcome, error)) {
	return t.tracer.StartRequest(ctx, flow, scope)
}

func (t *recordingTracer) StartPhase(ctx context.Context, flow, phase string, attempt int) (context.Context, func(error)) {
	return t.tracer.StartPhase(ctx, flow, phase, attempt)
}

func randomID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}
