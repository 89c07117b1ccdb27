package idemtest_test

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/pgstore"
)

// A correct flow passes every scenario: five per phase, plus a crash after
// the one foreign call, and, through the fault proxy, each of the request's
// round trips losing its reply, and stalling.
func TestCorrectFlowPassesEveryScenario(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config(b.orderFlow("orders.create", nil))
	cfg.Providers = []idemtest.FakeProvider{b.provider}
	cfg.DatabaseURL = b.url
	rep := idemtest.Explore(t, cfg)

	require.Equal(t, []string{"order_created", "charged", "responded"}, rep.Phases)
	require.Equal(t, []string{"charged"}, rep.ForeignPhases)
	require.Empty(t, rep.Unreached)
	require.Empty(t, rep.Failed())
	// Acquiring the key, each phase's statements and guarded commit: at
	// least two round trips per phase.
	trips := rep.RoundTrips
	require.GreaterOrEqual(t, trips, 2*3)
	require.Len(t, rep.Scenarios, 3*5+1+2*trips)
	require.Contains(t, rep.Summary(), fmt.Sprintf("16 scenarios over 3 phases (1 with a foreign call) and %d wire scenarios over %d round trips, 0 failed", 2*trips, trips))
	require.Equal(t, "lost_reply@1", rep.Scenarios[16].Name)
	require.Equal(t, fmt.Sprintf("stalled_reply@%d", trips), rep.Scenarios[len(rep.Scenarios)-1].Name)

	// The takeover of the charge phase had the second worker wait for the
	// paused one's row lock, and resolved it by resuming the paused one.
	takeover := scenarioNamed(t, rep, "lease_takeover@charged")
	require.Contains(t, strings.Join(takeover.Steps, "\n"), "waits for a row lock held by worker 1")
	require.Contains(t, strings.Join(takeover.Steps, "\n"), "worker 1 Execute; committed order_created; called \"charge\"")
	require.Contains(t, strings.Join(takeover.Steps, "\n"), "-> lock_lost")

	// The last round trip is the commit that stores the response. Its lost
	// reply the worker resolves by reading the key; its stalled reply it
	// cannot, and answers store unavailable; the kit finds the commit
	// landed, and the retry replays.
	lost := strings.Join(scenarioNamed(t, rep, fmt.Sprintf("lost_reply@%d", trips)).Steps, "\n")
	require.Contains(t, lost, "committed responded -> executed 201")
	stalled := strings.Join(scenarioNamed(t, rep, fmt.Sprintf("stalled_reply@%d", trips)).Steps, "\n")
	require.Contains(t, stalled, "-> store_unavailable")
	require.Contains(t, stalled, `the key shows phase "responded" committed`)
	require.Contains(t, stalled, "Execute -> replayed 201")
	// A stall mid-request leaves the key locked, its release unanswered: the
	// client's retry is told the request is in progress, and once the key
	// has idled the completer finishes it.
	completed := 0
	for _, s := range rep.Scenarios {
		steps := strings.Join(s.Steps, "\n")
		if strings.Contains(steps, "-> in_progress") && strings.Contains(steps, "-> claimed 1, completed 1") {
			completed++
		}
	}
	require.Positive(t, completed, "scenarios finished by the completer")

	// One charge per scenario and both baselines: the provider deduplicated
	// every repeated call.
	require.Len(t, b.provider.Effects(""), 18+2*trips)
}

// The input decides the path: a zero amount responds 402 from the charge
// phase, so the last phase is never reached and is reported as such.
func TestUnreachedPhasesAreReported(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config(b.orderFlow("orders.create", nil))
	cfg.Input.Amount = 0
	cfg.Check = nil
	rep := idemtest.Explore(t, cfg)
	require.Equal(t, []string{"order_created", "charged"}, rep.Phases)
	require.Equal(t, []string{"responded"}, rep.Unreached)
	require.Len(t, rep.Scenarios, 2*5)
	require.Contains(t, rep.Summary(), "not on this input's path, so not explored: responded")
}

func TestKindsNarrowTheExploration(t *testing.T) {
	t.Parallel()
	b := setup(t)
	store, err := pgstore.New(b.pool, &pgstore.Config{Schema: b.schema})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	cfg := b.config(b.orderFlow("orders.create", nil))
	cfg.Pool, cfg.Store = nil, store // a *pgstore.Store is enough on its own
	cfg.Kinds = []idemtest.Kind{idemtest.CrashAfterForeign, idemtest.LostCommitAck}
	rep := idemtest.Explore(t, cfg)
	require.Equal(t, []string{"lost_commit_ack@order_created", "crash_after_foreign@charged", "lost_commit_ack@charged", "lost_commit_ack@responded"},
		scenarioNames(rep))
}

// The user's observer and hook keep working: the kit calls the hook before
// its own and forwards every event, spans included.
func TestUserObserverAndHookAreComposed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	obs := &countingTracer{}
	hooks := 0
	cfg := b.config(b.orderFlow("orders.create", nil))
	cfg.Kinds = []idemtest.Kind{idemtest.CrashBeforeCommit}
	cfg.Runner = &idem.Config{Observer: obs, Test: idemtest.WithHook(idem.TestConfig{}, func(context.Context, idemtest.HookPoint) error {
		hooks++ // scenarios run one worker at a time here
		return nil
	})}
	idemtest.Explore(t, cfg)
	require.Positive(t, hooks)
	require.Positive(t, obs.events[idem.EventPhaseCommitted])
	require.Positive(t, obs.events[idem.EventTakeover])
	require.Positive(t, obs.phases)
}

func TestInvalidConfigIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	flow := b.orderFlow("orders.create", nil)
	store, err := pgstore.New(b.pool, &pgstore.Config{Schema: b.schema})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	poolConfig := b.pool.Config()
	poolConfig.MaxConns = 2
	tiny, err := pgxpool.NewWithConfig(context.Background(), poolConfig)
	require.NoError(t, err)
	t.Cleanup(tiny.Close)
	for name, cfg := range map[string]idemtest.Config[orderInput]{
		"tiny pool":        {Pool: tiny, Flow: flow},
		"schema mismatch":  {Store: store, Schema: "other", Flow: flow},
		"no flow":          {Pool: b.pool},
		"no store":         {Flow: flow},
		"unknown kind":     {Pool: b.pool, Flow: flow, Kinds: []idemtest.Kind{"meteor_strike"}},
		"negative retries": {Pool: b.pool, Flow: flow, MaxAttempts: -1},
		"bad runner":       {Pool: b.pool, Flow: flow, Runner: &idem.Config{Lease: 1}},
		"nil provider":     {Pool: b.pool, Flow: flow, Providers: []idemtest.FakeProvider{nil}},
		"long scope":       {Pool: b.pool, Flow: flow, Scope: strings.Repeat("s", 256)},
		"wire without url": {Pool: b.pool, Flow: flow, Kinds: []idemtest.Kind{idemtest.LostReply}},
		"url not a url":    {Pool: b.pool, Flow: flow, DatabaseURL: "host=db password=hunter2"},
		"url of a socket":  {Pool: b.pool, Flow: flow, DatabaseURL: "postgres:///db?host=/var/run/postgresql&password=hunter2"},
		"negative timeout": {Pool: b.pool, Flow: flow, DatabaseURL: b.url, WireTimeout: -1},
	} {
		rep, err := idemtest.ExploreContext(context.Background(), cfg)
		require.ErrorIs(t, err, idemtest.ErrInvalidConfig, name)
		require.NotContains(t, err.Error(), "hunter2", name)
		require.Nil(t, rep, name)
	}
}

// A DatabaseURL whose connections cannot find the flow's tables (no
// search_path here) fails the run through the proxy, and no wire scenario
// runs; the others still do.
func TestWireBaselineMustFindTheFlowsTables(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config(b.orderFlow("orders.create", nil))
	cfg.DatabaseURL = pgtest.DatabaseURL(t)
	cfg.Kinds = []idemtest.Kind{idemtest.CrashAfterCommit, idemtest.LostReply}
	rep, err := idemtest.ExploreContext(context.Background(), cfg)
	require.NoError(t, err)
	require.Len(t, rep.Scenarios, 3)
	require.Zero(t, rep.RoundTrips)
	require.Equal(t, []*idemtest.Scenario{rep.WireBaseline}, rep.Failed())
	require.Contains(t, rep.Summary(), "3 scenarios over 3 phases (1 with a foreign call) and no wire scenario (the run through the fault proxy failed), 1 failed")
	msg := rep.Err().Error()
	require.Contains(t, msg, "the uninterrupted run through the fault proxy failed, so no wire scenario ran")
	require.Contains(t, msg, "is DatabaseURL the database Pool reaches, can its connections find the flow's tables")
}

func scenarioNames(rep *idemtest.Report) []string {
	var names []string
	for _, s := range rep.Scenarios {
		names = append(names, s.Name)
	}
	return names
}

// countingTracer is an observer that also traces; runs are sequential in
// the test that uses it, except the takeover scenario it does not run.
type countingTracer struct {
	events map[idem.EventKind]int
	phases int
}

func (c *countingTracer) Observe(_ context.Context, e idem.Event) {
	if c.events == nil {
		c.events = map[idem.EventKind]int{}
	}
	c.events[e.Kind]++
}

func (c *countingTracer) StartRequest(ctx context.Context, _, _ string) (context.Context, func(*idem.Outcome, error)) {
	return ctx, func(*idem.Outcome, error) {}
}

func (c *countingTracer) StartPhase(ctx context.Context, _, _ string, _ int) (context.Context, func(error)) {
	c.phases++
	return ctx, func(error) {}
}

// TestWireScenariosLeaveNoGoroutine is not parallel: it counts the
// process's goroutines, which tests running beside it would change. Every
// wire scenario's proxy and pools, stalled connections included, are closed
// by the time the exploration returns.
func TestWireScenariosLeaveNoGoroutine(t *testing.T) {
	b := setup(t)
	flow := idem.MustNewFlow("orders.noted", []idem.Phase[orderInput]{{
		Name: "noted",
		Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[orderInput]) (idem.Result, error) {
			_, err := tx.Exec(ctx, `INSERT INTO audit (key_id, what) VALUES ($1, 'noted')`, run.Key().ID)
			return idem.RespondJSON(http.StatusCreated, map[string]string{"status": "noted"}), err
		},
	}}, nil)
	baseline := ownGoroutines()

	rep := idemtest.Explore(t, idemtest.Config[orderInput]{
		Pool: b.pool, Flow: flow, DatabaseURL: b.url,
		Kinds: []idemtest.Kind{idemtest.LostReply, idemtest.StalledReply},
	})
	require.Len(t, rep.Scenarios, 2*rep.RoundTrips)

	// Goroutines on their way out may not be reaped yet: yield (never
	// sleep) until the count is back, or one leaked.
	for deadline := time.Now().Add(waitLimit); ownGoroutines() > baseline && time.Now().Before(deadline); {
		runtime.Gosched()
	}
	if n := ownGoroutines(); n > baseline {
		var stacks strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
		t.Fatalf("%d goroutines after the exploration, %d before:\n%s", n, baseline, stacks.String())
	}
}

// ownGoroutines counts the goroutines running, less pgconn's background
// readers: pgx starts one on a pooled connection whose write was slow and
// keeps it with the connection, which stays in the test's pool after the
// exploration. That is the pool's, not a leak of the kit's.
func ownGoroutines() int {
	var all strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&all, 2)
	n := 0
	for _, g := range strings.Split(all.String(), "\n\n") {
		if strings.HasPrefix(g, "goroutine ") && !strings.Contains(g, "pgconn/internal/bgreader") {
			n++
		}
	}
	return n
}
