package idem_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/testfixture"
	"github.com/go-idem/idem/pgstore"
)

// workTally adds up what several maintainers report and says when all of
// the expected work is done. A reconcile verdict is not the end of a
// doubtful key's work: the pass goes on to drive the key to its response, so
// a doubtful key counts as done only when the commit of finishPhase (the
// sms flow's last phase, which stores the response) is reported.
type workTally struct {
	mu                          sync.Mutex
	reaped, completed, finished int
	completedKeys               map[string]int
	finishFlow, finishPhase     string
	want                        [3]int
	done                        chan struct{}
	closed                      bool
}

func (w *workTally) observer(own *countingObserver) idem.Observer {
	own.onEvent = func(e idem.Event) {
		w.mu.Lock()
		defer w.mu.Unlock()
		switch e.Kind {
		case idem.EventReaped:
			w.reaped += e.Count
		case idem.EventCompleted:
			w.completed++
			w.completedKeys[e.Key]++
		case idem.EventPhaseCommitted:
			if e.Flow != w.finishFlow || e.Phase != w.finishPhase {
				return
			}
			w.finished++
		default:
			return
		}
		if !w.closed && w.reaped >= w.want[0] && w.completed >= w.want[1] && w.finished >= w.want[2] {
			w.closed = true
			close(w.done)
		}
	}
	return own
}

// Two application instances run the maintenance services on one database at
// the same time: every expired key is deleted once, every abandoned request
// is completed once (one ride, one charge, one receipt each) and every
// needs_reconcile key is reconciled once (one message each). Both stop
// cleanly when their context ends.
func TestTwoMaintainersDoNoDoubleWork(t *testing.T) {
	t.Parallel()
	twoMaintainersDoNoDoubleWork(t, setupSMS(t))
}

func twoMaintainersDoNoDoubleWork(t *testing.T, b *smsBundle) {
	ctx := context.Background()
	const expired, abandoned, doubtful = 300, 12, 4

	b.insertKeys(t, "expired", expired, idemtype.KeyStateExpired, b.clock.Now())
	for i := range abandoned {
		b.abandon(t, fmt.Sprint("ab-", i))
	}
	for i := range doubtful {
		b.gateway.lose = true
		_, err := b.runner(t, nil).Execute(ctx, b.flow, b.req(fmt.Sprint("sms-", i)))
		require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	}
	require.Equal(t, abandoned, b.provider.Charges())
	b.clock.Advance(10 * time.Minute)

	tally := &workTally{
		completedKeys: map[string]int{}, want: [3]int{expired, abandoned, doubtful}, done: make(chan struct{}),
		finishFlow: b.flow.Name(), finishPhase: b.flow.PhaseNames()[len(b.flow.PhaseNames())-1],
	}
	cfg := &idem.MaintainerConfig{
		ReapInterval: 5 * time.Millisecond, CompleteInterval: 5 * time.Millisecond, ReconcileInterval: 5 * time.Millisecond,
		Reap:      idem.ReapConfig{BatchSize: 7},
		Complete:  idem.CompleteConfig{IdleFor: time.Minute, BatchSize: 2},
		Reconcile: idem.ReconcileConfig{IdleFor: time.Minute, BatchSize: 1},
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	observers := []*countingObserver{newCountingObserver(), newCountingObserver()}
	stopped := make(chan error, len(observers))
	for _, obs := range observers {
		r := b.testBundle.runner(t, &idem.Config{Flows: []idem.AnyFlow{b.testBundle.flow, b.flow}, Observer: tally.observer(obs)})
		m, err := idem.NewMaintainer(r, cfg)
		require.NoError(t, err)
		go func() { stopped <- m.Serve(runCtx) }()
	}

	// A deadline on the wait only, so a broken maintainer fails the test
	// rather than hanging it; generous, as a loaded machine needs.
	select {
	case <-tally.done:
	case <-time.After(5 * time.Minute):
		tally.mu.Lock()
		defer tally.mu.Unlock()
		t.Fatalf("maintainers did not finish: reaped %d/%d, completed %d/%d, reconciled and finished %d/%d",
			tally.reaped, expired, tally.completed, abandoned, tally.finished, doubtful)
	}
	stop()
	for range observers {
		require.NoError(t, <-stopped)
	}

	for i, obs := range observers {
		t.Logf("maintainer %d: reaped %d, completed %d, reconciled %d", i,
			obs.sum(idem.EventReaped), obs.n(idem.EventCompleted), obs.n(idem.EventReconciled))
	}
	require.Equal(t, expired, observers[0].sum(idem.EventReaped)+observers[1].sum(idem.EventReaped))
	require.Equal(t, abandoned, observers[0].n(idem.EventCompleted)+observers[1].n(idem.EventCompleted))
	require.Equal(t, doubtful, observers[0].n(idem.EventReconciled)+observers[1].n(idem.EventReconciled))
	for key, n := range tally.completedKeys {
		require.Equal(t, 1, n, key)
	}

	require.Zero(t, b.countKeys(t, "expired"))
	require.Equal(t, abandoned, b.countRows(t, "idem_keys WHERE key LIKE 'ab-%' AND status = 'finished'"))
	require.Equal(t, abandoned, b.countRows(t, "rides"))
	require.Equal(t, abandoned, b.countRows(t, "jobs"), "one receipt per ride")
	require.Equal(t, abandoned, b.provider.Charges())
	for i := range doubtful {
		key := fmt.Sprint("sms-", i)
		require.Equal(t, idemtype.StoredFinished, b.key(t, key).Status)
		require.Equal(t, 1, b.gateway.times(b.ref(t, key)), key)
	}
}

// Cancelling the maintainer's context interrupts a request it is completing
// the way a client disconnect would: the phase rolls back, the key is
// released for the next pass, and Run returns.
func TestMaintainerStopsCleanly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.abandon(t, "k1")
	b.clock.Advance(10 * time.Minute)
	inPhase := make(chan struct{})
	b.hooks["charge_created"] = func(ctx context.Context, _ idem.Tx, _ *idem.Attempt[rideInput]) error {
		close(inPhase)
		<-ctx.Done()
		return ctx.Err()
	}
	m, err := idem.NewMaintainer(b.runner(t, nil), &idem.MaintainerConfig{
		ReapInterval: -1, ReconcileInterval: -1, Complete: idem.CompleteConfig{IdleFor: time.Minute},
	})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- m.Serve(ctx) }()

	<-inPhase
	require.ErrorIs(t, m.Serve(ctx), idem.ErrMaintainerRunning)
	stop()
	require.NoError(t, <-stopped)

	rec := b.key(t, "k1")
	require.Equal(t, idemtype.StoredRunning, rec.Status)
	require.Equal(t, "ride_created", rec.RecoveryPoint)
	require.Nil(t, rec.LockedAt, "released, not left for the lease to expire")
	require.Equal(t, 0, b.countRows(t, "jobs"))
}

func TestNewMaintainerChecksItsConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bare, err := idem.NewRunner(b.storeFor(t), nil)
	require.NoError(t, err)
	_, err = idem.NewMaintainer(bare, nil)
	require.ErrorIs(t, err, idem.ErrUnknownFlow, "completing needs the flows")
	m, err := idem.NewMaintainer(bare, &idem.MaintainerConfig{CompleteInterval: -1, ReconcileInterval: -1})
	require.NoError(t, err, "a reaper-only maintainer needs no flows")
	require.Equal(t, 5*time.Minute, m.Config().ReapInterval)
	require.Equal(t, 1000, m.Config().Reap.BatchSize)

	_, err = idem.NewMaintainer(nil, nil)
	require.Error(t, err)
	_, err = idem.NewMaintainer(b.runner(t, nil), &idem.MaintainerConfig{Reap: idem.ReapConfig{BatchSize: -5}})
	require.ErrorContains(t, err, "BatchSize")

	def, err := idem.NewMaintainer(b.runner(t, nil), nil)
	require.NoError(t, err)
	require.Equal(t, time.Minute, def.Config().CompleteInterval)
	require.Equal(t, time.Minute, def.Config().ReconcileInterval)
	require.Equal(t, 5*time.Minute, def.Config().Complete.IdleFor)
}

// Under a JSON handler the maintainer's intervals read as durations
// ("5m0s"), not as integer nanoseconds.
func TestMaintainerLogsDurationsAsStrings(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var logs testfixture.Buffer
	r := b.runner(t, &idem.Config{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	m, err := idem.NewMaintainer(r, &idem.MaintainerConfig{CompleteInterval: 90 * time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // Serve logs its start, finds ctx done and stops
	require.NoError(t, m.Serve(ctx))

	var started map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var line map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line))
		if line["msg"] == "idem: maintainer started" {
			started = line
		}
	}
	require.NotNil(t, started, logs.String())
	require.Equal(t, "5m0s", started["reap_interval"])
	require.Equal(t, "1m30s", started["complete_interval"])
	require.Equal(t, "1m0s", started["reconcile_interval"])
}

// Under a JSON handler a reconcile verdict reads as its name ("not_happened"),
// not as the integer behind it.
func TestReconciledVerdictLogsAsItsName(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	ctx := context.Background()
	var logs testfixture.Buffer
	r := b.testBundle.runner(t, &idem.Config{Flows: []idem.AnyFlow{b.flow}, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	b.gateway.lose = true
	_, err := r.Execute(ctx, b.flow, b.req("k1"))
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	_, err = r.Reconcile(ctx, "user:1", "k1")
	require.NoError(t, err)

	var verdicts []any
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var line map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line))
		if line["msg"] == "idem: reconciled" {
			verdicts = append(verdicts, line["verdict"])
		}
	}
	t.Logf("verdicts logged: %v", verdicts)
	require.Equal(t, []any{"not_happened"}, verdicts, logs.String())
}

// While the database is down, each failed maintainer pass is logged once,
// and its text is the store's ("store unavailable: ... connection
// refused"), not a scanning library's "query multiple result rows".
func TestMaintainerLogsEachFailedPassOnceWithAPlainMessage(t *testing.T) {
	t.Parallel()
	for _, service := range []string{"reaper", "completer", "reconciler"} {
		t.Run(service, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			cfg, err := pgxpool.ParseConfig(b.schema.URL)
			require.NoError(t, err)
			cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", refusedPort(t)
			cfg.ConnConfig.Fallbacks = nil
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			down, err := pgstore.New(pool, &pgstore.Config{Schema: b.schema.Name})
			require.NoError(t, err, "an unreachable database is not checked")
			t.Cleanup(down.Close)

			var logs testfixture.Buffer
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var storeErrors atomic.Int32
			var firstPass atomic.Value
			r, err := idem.NewRunner(down, &idem.Config{
				Flows:  []idem.AnyFlow{b.flow},
				Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
				Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) {
					if e.Kind == idem.EventStoreError && storeErrors.Add(1) == 2 {
						// The second pass failed: the first has logged all
						// it will, and the second nothing yet.
						firstPass.Store(logs.String())
						cancel()
					}
				}),
			})
			require.NoError(t, err)
			mc := &idem.MaintainerConfig{ReapInterval: -1, CompleteInterval: -1, ReconcileInterval: -1}
			switch service {
			case "reaper":
				mc.ReapInterval = time.Millisecond
			case "completer":
				mc.CompleteInterval = time.Millisecond
			case "reconciler":
				mc.ReconcileInterval = time.Millisecond
			}
			m, err := idem.NewMaintainer(r, mc)
			require.NoError(t, err)
			require.NoError(t, m.Serve(ctx))

			var failures []string
			sc := bufio.NewScanner(strings.NewReader(firstPass.Load().(string)))
			for sc.Scan() {
				var line map[string]any
				require.NoError(t, json.Unmarshal(sc.Bytes(), &line))
				if line["level"] == "WARN" || line["level"] == "ERROR" {
					failures = append(failures, sc.Text())
				}
			}
			t.Logf("%s: lines for one failed pass: %v", service, failures)
			require.Len(t, failures, 1, "one line per failed pass")
			require.NotContains(t, failures[0], "scany")
			require.Contains(t, failures[0], "connection refused")
		})
	}
}

// refusedPort is a TCP port on 127.0.0.1 that nobody listens on.
func refusedPort(t *testing.T) uint16 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return uint16(port)
}

// With LogKeys off, the maintenance passes' log lines name a key by its
// key_id only: not in their attributes, and not inside the error text
// either ("key still needs reconciliation" used to carry key "h3").
func TestMaintenanceLogsDoNotCarryTheKeyWithoutLogKeys(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	ctx := context.Background()
	var logs testfixture.Buffer
	r := b.testBundle.runner(t, &idem.Config{Flows: []idem.AnyFlow{b.flow}, Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	const key = "h3-secret-key"
	crashing := b.runner(t, func(_ context.Context, at idemtest.HookPoint) error {
		if at.Where == idemtest.HookAfterForeign {
			return idemtest.ErrSimulatedCrash
		}
		return nil
	})
	_, err := crashing.Execute(ctx, b.flow, b.req(key))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	b.clock.Advance(time.Hour)

	res, err := r.Complete(ctx, &idem.CompleteConfig{IdleFor: time.Minute})
	require.NoError(t, err)
	require.Equal(t, 1, res.NeedsReconcile)
	b.gateway.unknown = true
	b.clock.Advance(time.Hour)
	rres, err := r.ReconcileAll(ctx, &idem.ReconcileConfig{IdleFor: time.Minute})
	require.NoError(t, err)
	require.Equal(t, 1, rres.Unresolved)

	t.Logf("logs:\n%s", logs.String())
	require.Contains(t, logs.String(), "key still needs reconciliation")
	require.NotContains(t, logs.String(), key)
	require.NotContains(t, logs.String(), "user:1", "nor the scope")
}
