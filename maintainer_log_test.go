package idem_test

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/internal/testfixture"
	"github.com/go-idem/idem/pgstore"
)

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
