package idemtest_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/pgstore"
)

// A correct flow passes every scenario: five per phase, plus a crash after
// the one foreign call.
func TestCorrectFlowPassesEveryScenario(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config(b.orderFlow("orders.create", nil))
	cfg.Providers = []idemtest.FakeProvider{b.provider}
	rep := idemtest.Explore(t, cfg)

	require.Equal(t, []string{"order_created", "charged", "responded"}, rep.Phases)
	require.Equal(t, []string{"charged"}, rep.ForeignPhases)
	require.Empty(t, rep.Unreached)
	require.Len(t, rep.Scenarios, 3*5+1)
	require.Empty(t, rep.Failed())
	require.Contains(t, rep.Summary(), "16 scenarios over 3 phases (1 with a foreign call), 0 failed")

	// The takeover of the charge phase had the second worker wait for the
	// paused one's row lock, and resolved it by resuming the paused one.
	takeover := scenarioNamed(t, rep, "lease_takeover@charged")
	require.Contains(t, strings.Join(takeover.Steps, "\n"), "waits for a row lock held by worker 1")
	require.Contains(t, strings.Join(takeover.Steps, "\n"), "worker 1 Execute; committed order_created; called \"charge\"")
	require.Contains(t, strings.Join(takeover.Steps, "\n"), "-> lock_lost")

	// One charge per scenario and the baseline: the provider deduplicated
	// every repeated call.
	require.Len(t, b.provider.Effects(""), 17)
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
	cfg.Runner = &idem.Config{Observer: obs, Test: idem.TestConfig{Hook: func(context.Context, idem.HookPoint) error {
		hooks++ // scenarios run one worker at a time here
		return nil
	}}}
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
	} {
		rep, err := idemtest.ExploreContext(context.Background(), cfg)
		require.ErrorIs(t, err, idemtest.ErrInvalidConfig, name)
		require.Nil(t, rep, name)
	}
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
