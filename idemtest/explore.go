package idemtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/pgstore"
)

// Explore runs the flow once uninterrupted, then once per crash point of
// that run (see Kind), each on a fresh key, and checks every invariant after
// each. With Config.DatabaseURL it also runs the request once through a
// FaultProxy, counting its round trips to Postgres, then once per round
// trip and wire kind, breaking that round trip's reply. It logs a summary
// line with the number of scenarios and wire scenarios, and fails t with
// the accounts of the failed scenarios, in the order they failed (see
// Report.Err). It returns the report.
//
//	func TestCreateOrder(t *testing.T) {
//		t.Parallel()
//		Explore(t, Config[orders.Params]{
//			Pool: pool, Flow: orders.NewFlow(payments), Input: orders.Params{SKU: "rocket", Quantity: 2},
//			Compare: EqualJSON("id", "charge_id"),
//			Check:   exactlyOneOrderAndOneCharge,
//		})
//	}
//
// Explore is safe under t.Parallel: faults are injected through each
// runner's own Config.Test hooks and clock, and each wire scenario's own
// proxy, never through global state.
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
	x.userHook, x.base.Test = hookOf(x.base.Test), idem.TestConfig{}
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
	var wire []Kind
	for _, phase := range x.phases {
		for _, kind := range cfg.Kinds {
			foreign, hasForeign := x.foreign[phase]
			switch {
			case kind.Wire():
				continue
			case kind == CrashAfterForeign && !hasForeign:
				continue
			}
			rep.Scenarios = append(rep.Scenarios, x.runScenario(ctx, kind, phase, foreign.name))
		}
	}
	for _, kind := range cfg.Kinds {
		if kind.Wire() && !slices.Contains(wire, kind) {
			wire = append(wire, kind)
		}
	}
	if cfg.PreviousFlow != nil {
		rep.Scenarios = append(rep.Scenarios, x.runUpgrades(ctx)...)
	}
	if len(wire) > 0 {
		rep.WireBaseline = x.runWireBaseline(ctx)
		if !rep.WireBaseline.Failed() {
			rep.RoundTrips = x.trips
			rep.Scenarios = append(rep.Scenarios, x.runWireScenarios(ctx, wire)...)
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
	userHook func(context.Context, HookPoint) error
	lease    time.Duration
	runID    string

	// From the baseline: the phases it committed, in order, and its foreign
	// calls by phase.
	phases  []string
	foreign map[string]foreignCall

	// handed maps every downstream key a worker of this exploration was
	// about to send to the scenario key of that worker, so that a call a
	// provider received is told apart by its key when it carries no
	// scenario (wire scenarios run side by side). ended counts the
	// scenarios that ended, for Scenario.ended.
	handed   sync.Map
	ended    atomic.Int64
	response *idemtype.Response

	// From the wire baseline: how many round trips the request made
	// through the proxy, and how many it had made at each hook point.
	trips     int
	tripMarks []tripMark
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
	if flow := x.flowOf(w); !slices.ContainsFunc(c.Flows, func(f idem.AnyFlow) bool { return f != nil && f.Name() == flow.Name() }) {
		c.Flows = append(c.Flows, flow)
	}
	if c.Logger == nil {
		c.Logger = discardLogger
	}
	if w != nil {
		c.Test = WithHook(idem.TestConfig{Now: now}, w.hook)
		c.Observer = observerFor(w, x.base.Observer)
	}
	return &c
}

func (x *explorer[In]) newScenario(ctx context.Context, name string, kind Kind, phase, description string) *scenario {
	return x.newScenarioKey(ctx, name, name, kind, phase, description)
}

// newScenarioKey is newScenario on the key named keyName rather than name.
func (x *explorer[In]) newScenarioKey(ctx context.Context, name, keyName string, kind Kind, phase, description string) *scenario {
	start := time.Now().UTC().Truncate(time.Microsecond)
	sc := &scenario{
		report:   &Scenario{Name: name, Kind: kind, Phase: phase, Description: description, Key: "idemtest-" + x.runID + "-" + keyName},
		scope:    x.cfg.Scope,
		userHook: x.userHook,
		clock:    NewClock(start),
		commits:  map[string]int{},
		notDone:  map[string]int{},
		marks:    x.providerMarks(),
		handed:   &x.handed,
		input:    x.cfg.Input,
		ended:    &x.ended,
	}
	if x.cfg.Setup != nil {
		in, err := x.cfg.Setup(ctx, sc.report.Key)
		if err != nil {
			sc.violate("Setup: %v", err)
		}
		sc.input = in
	}
	return sc
}

// flowOf is the flow worker w runs: with Config.NewFlow, one of its own,
// built the first time it is asked for, so that no memory is shared between
// simulated processes.
func (x *explorer[In]) flowOf(w *worker) *idem.Flow[In] {
	if w == nil || x.cfg.NewFlow == nil {
		return x.cfg.Flow
	}
	if w.flow == nil {
		w.flow = x.cfg.NewFlow()
	}
	return w.flow.(*idem.Flow[In])
}

// inputOf is the input the scenario sends (Config.Input, or what
// Config.Setup returned for it).
func inputOf[In any](sc *scenario) In {
	in, _ := sc.input.(In)
	return in
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
	sc := x.newScenario(ctx, "baseline", "", "", "the flow runs once, uninterrupted, to give the path and the response every scenario is held to")
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
	sc := x.newScenario(ctx, string(kind)+"@"+phase, kind, phase, kind.describe(phase, foreign))
	defer sc.end()
	f := &fault{kind: kind, phase: phase, bypass: x.newBypassWatch(kind)}
	var final *idemtype.Response
	if kind == LeaseTakeover {
		final = x.takeover(ctx, sc, f)
	} else {
		out, err := x.call(ctx, sc, f, opRun, x.store)
		if f.fired && !f.finished && x.lateRetry(kind) {
			sc.report.Description += "; its client comes back a day later"
			sc.advance(lateBy, "the client comes back a day later: the phases left run at another time, on another date")
		}
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

type op string

const (
	opRun         op = "Execute"
	opRunPrevious op = "Execute with the previous definition"
	opReconcile   op = "Reconcile"
	opWire        op = "Execute through the fault proxy"
	opComplete    op = "Complete (a completer pass)"
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
	return x.callWith(ctx, sc, w, o, store, x.runnerConfig(w, now))
}

// callWith is call for worker w, on a runner made with cfg.
func (x *explorer[In]) callWith(ctx context.Context, sc *scenario, w *worker, o op, store idemdriver.Store, cfg *idem.Config) (*idem.Outcome, error) {
	ctx = withScenario(ctx, sc.report.Key)
	r, err := idem.NewRunner(store, cfg)
	if err != nil {
		sc.violate("could not make a runner: %v", err)
		return &idem.Outcome{Kind: idem.OutcomeInvalid}, err
	}
	var out *idem.Outcome
	switch o {
	case opRun, opWire:
		out, err = r.Execute(ctx, x.flowOf(w), idem.Request{Scope: sc.scope, Key: sc.report.Key, Path: x.cfg.Path, Params: inputOf[In](sc)})
	case opReconcile:
		out, err = r.Reconcile(ctx, sc.scope, sc.report.Key)
	}
	if out == nil {
		out = &idem.Outcome{Kind: idem.OutcomeFailed}
	}
	sc.workerStep(w.n, w.describe(o, outcomeText(out, err)))
	return out, err
}

func randomID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

// lateBy is how much later than its crash the client of a
// crash_after_commit scenario comes back when phases are left to run.
const lateBy = 24 * time.Hour

// lateRetry reports whether the client of a scenario of kind comes back a
// day later when its fault left the key unfinished: crash_after_commit,
// unless the runner would by then treat the key as abandoned
// (Config.UnfinishedRetention). (A finished key is left alone: a day later it may
// have expired.)
func (x *explorer[In]) lateRetry(kind Kind) bool {
	if kind != CrashAfterCommit {
		return false
	}
	abandon := x.base.WithDefaults().UnfinishedRetention
	return abandon < 0 || abandon > lateBy+3*x.lease
}
