package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/internal/testfixture"
)

// A Citus worker killed with SIGKILL mid-traffic, on a cluster of the
// test's own (it kills a node, which the shared one must not see): 240
// keys, each in a scope of its own, spread over both workers, sent by 12
// clients at once through one runner on the coordinator. Once a third of
// them have executed, and with one key of the victim held inside its
// second phase, the victim is killed. What the clients see is recorded, by
// the worker their key lives on and by whether it was sent before or after
// the kill: keys on the dead worker fail (store unavailable), keys on the
// live one go on executing, every one of them. The worker is restarted on
// its port, and every key is retried, twice, with the test clock moved on
// by one lease and a completer pass between: every key ends finished, with
// one ride, one receipt job and one charge, and no key executed twice.
func TestCitusWorkerKilledMidTraffic(t *testing.T) {
	t.Parallel()
	cluster := pgtest.NewCitus(t, &pgtest.CitusOptions{Logf: t.Logf})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b := setupCitusOn(t, ownCitusSchema(t, cluster))
	victim := cluster.Workers()[0]

	const keys, clients = 240, 12
	type keyState struct {
		scope  string
		worker int // the port of the worker holding its scope
		// Filled in by the traffic.
		first     idem.OutcomeKind
		firstErr  string
		afterKill bool // its first request was sent after the kill
		executed  atomic.Int32
		bodies    atomic.Int32 // phase bodies run, rolled back or not
	}
	states := make([]*keyState, keys)
	byScope := map[string]*keyState{}
	for i := range states {
		s := &keyState{scope: fmt.Sprintf("user:%d", i)}
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT nodeport FROM citus_shards
			WHERE shardid = get_shard_id_for_distribution_column('idem_keys', $1::text)`, s.scope).Scan(&s.worker))
		states[i], byScope[s.scope] = s, s
	}
	onVictim := func(s *keyState) bool { return s.worker == victim.Port() }
	require.Positive(t, countIf(states, onVictim), "keys on the victim")
	require.Positive(t, countIf(states, func(s *keyState) bool { return !onVictim(s) }), "keys on the survivor")
	held := states[slices.IndexFunc(states, onVictim)]

	// Every phase body counts itself against its key; the held key waits in
	// its second phase until the victim is dead.
	pause := testfixture.NewPause(t)
	for _, phase := range []string{"ride_created", "charge_created", "receipt_enqueued"} {
		b.hooks[phase] = func(ctx context.Context, _ idem.Tx, run *idem.Attempt[rideInput]) error {
			s := byScope[run.Key().Scope]
			s.bodies.Add(1)
			if s == held && phase == "charge_created" {
				pause.Hold(ctx)
			}
			return nil
		}
	}
	runner := b.runner(t, &idem.Config{Logger: slog.New(slog.DiscardHandler)})
	request := func(s *keyState) idem.Request {
		return idem.Request{Scope: s.scope, Key: "ride", Method: "POST", Path: "/rides", Params: rideInput{Origin: s.scope, Amount: 20}}
	}
	execute := func(s *keyState) (*idem.Outcome, error) {
		out, err := runner.Execute(ctx, b.flow, request(s))
		if out != nil && out.Kind == idem.OutcomeExecuted {
			s.executed.Add(1)
		}
		return out, err
	}

	// The traffic: each key sent once, by whichever client is free.
	var killed atomic.Bool
	var executedSoFar atomic.Int32
	third := make(chan struct{})
	thirdOnce := sync.OnceFunc(func() { close(third) })
	queue := make(chan *keyState)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for s := range queue {
				s.afterKill = killed.Load()
				out, err := execute(s)
				s.first = out.Kind
				if err != nil {
					s.firstErr = err.Error()
				}
				if out.Kind == idem.OutcomeExecuted && executedSoFar.Add(1) >= keys/3 {
					thirdOnce()
				}
			}
		})
	}
	killErr := make(chan error, 1)
	go func() {
		for _, ready := range []<-chan struct{}{third, pause.Reached()} {
			select {
			case <-ready:
			case <-ctx.Done():
				killErr <- ctx.Err()
				return
			}
		}
		err := victim.Kill()
		killed.Store(true)
		pause.Release()
		killErr <- err
	}()
	// The held key goes first, so that it is inside its phase early.
	queue <- held
	for _, s := range states {
		if s != held {
			queue <- s
		}
	}
	close(queue)
	wg.Wait()
	require.NoError(t, <-killErr)

	// What the clients saw, by where the key lives and when it was sent.
	type tally map[string]int
	seen := map[string]tally{}
	for _, s := range states {
		where := "survivor"
		if onVictim(s) {
			where = "victim"
		}
		when := "sent before the kill (done or in flight at it)"
		if s.afterKill {
			when = "sent after the kill"
		}
		group := where + ", " + when
		if s == held {
			group = "victim, held inside its second phase at the kill"
		}
		if seen[group] == nil {
			seen[group] = tally{}
		}
		seen[group][string(s.first)]++
	}
	for _, group := range slices.Sorted(maps.Keys(seen)) {
		t.Logf("first request of the keys on the %s: %v", group, seen[group])
	}
	errorSamples := map[string]int{}
	for _, s := range states {
		if s.firstErr != "" {
			errorSamples[firstLine(s.firstErr)]++
		}
	}
	for msg, n := range errorSamples {
		t.Logf("  error seen %d×: %s", n, msg)
	}
	require.Positive(t, countIf(states, func(s *keyState) bool { return onVictim(s) && s.afterKill }),
		"some keys of the victim were sent after the kill")
	for _, s := range states {
		if onVictim(s) && (s.afterKill || s == held) {
			require.Equal(t, idem.OutcomeStoreUnavailable, s.first, "%s on the dead worker: %s", s.scope, s.firstErr)
		}
		if !onVictim(s) {
			require.Equal(t, idem.OutcomeExecuted, s.first, "%s on the live worker is served: %s", s.scope, s.firstErr)
		}
	}

	// Back on its port: retry every key; the keys still locked wait for
	// their lease, which the test clock moves past, and the completer
	// finishes them; a last retry of every key replays.
	require.NoError(t, victim.Restart(ctx))
	retried := tally{}
	for _, s := range states {
		out, err := execute(s)
		// In progress: a key its dead attempt still holds, until the lease
		// ends. Store unavailable would be a coordinator connection to the
		// old process, broken, used once more: the completer or the next
		// retry finishes the key.
		if err != nil && !errors.Is(err, idem.ErrInProgress) && !errors.Is(err, idem.ErrStoreUnavailable) {
			t.Errorf("%s: retry after the restart: %v", s.scope, err)
		}
		retried[string(out.Kind)]++
	}
	t.Logf("retry of every key after the restart: %v", retried)
	b.clock.Advance(runner.Config().Lease + time.Minute)
	completed, err := runner.Complete(ctx, &idem.CompleteConfig{IdleFor: time.Minute})
	require.NoError(t, err)
	t.Logf("completer pass, the clock one lease on: %+v", *completed)
	replayed := tally{}
	for _, s := range states {
		out, err := execute(s)
		require.NoError(t, err, s.scope)
		require.Equal(t, 201, out.Response.Status, s.scope)
		replayed[string(out.Kind)]++
	}
	t.Logf("second retry of every key: %v", replayed)
	require.Equal(t, tally{string(idem.OutcomeReplayed): keys}, replayed, "every key finished")

	// Nothing ran twice: one ride, one job, one charge a key, and at most one
	// executed outcome a key (a request whose commit landed as the worker
	// died reads as failed, and its retry replays).
	perScope := func(table string) map[string]int {
		rows, err := b.pool.Query(ctx, "SELECT scope, count(*)::int FROM "+table+" GROUP BY scope")
		require.NoError(t, err)
		counts := map[string]int{}
		var scope string
		var n int
		_, err = pgx.ForEachRow(rows, []any{&scope, &n}, func() error {
			counts[scope] = n
			return nil
		})
		require.NoError(t, err)
		return counts
	}
	rides, jobs := perScope("rides"), perScope("jobs")
	executedTwice, bodiesRerun, maxBodies := 0, 0, int32(0)
	for _, s := range states {
		require.Equal(t, 1, rides[s.scope], "%s: one ride", s.scope)
		require.Equal(t, 1, jobs[s.scope], "%s: one receipt job", s.scope)
		if s.executed.Load() > 1 {
			executedTwice++
		}
		if s.bodies.Load() > 3 {
			bodiesRerun++
		}
		maxBodies = max(maxBodies, s.bodies.Load())
	}
	require.Zero(t, executedTwice, "no key executed twice")
	require.Equal(t, keys, b.provider.Charges(), "one charge a key")
	var unfinished int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM idem_keys WHERE status <> 'finished'").Scan(&unfinished))
	require.Zero(t, unfinished, "no stuck key")
	t.Logf("%d keys over 2 workers (%d on the killed one): %d rides, %d jobs, %d charges (%d provider calls); keys executed twice: %d; "+
		"keys whose phase bodies ran again after a transaction died with the worker: %d (at most %d bodies for 3 phases); unfinished keys: %d",
		keys, countIf(states, onVictim), len(rides), len(jobs), b.provider.Charges(), b.provider.Calls(), executedTwice,
		bodiesRerun, maxBodies, unfinished)
}

// ownCitusSchema is a schema on a Citus cluster of the test's own, for
// setupCitusOn: the cluster goes with the test, the schema with it.
func ownCitusSchema(t *testing.T, cluster *pgtest.Citus) *pgtest.Schema {
	t.Helper()
	ctx := context.Background()
	const name = "idem_kill"
	admin, err := pgx.Connect(ctx, cluster.URL())
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+name)
	require.NoError(t, admin.Close(ctx))
	require.NoError(t, err)
	url := cluster.URL() + "&search_path=" + name
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &pgtest.Schema{Name: name, URL: url, Pool: pool}
}

func countIf[T any](xs []T, pred func(T) bool) int {
	n := 0
	for _, x := range xs {
		if pred(x) {
			n++
		}
	}
	return n
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
