package idem_test

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
)

// Under a JSON handler the maintainer's intervals read as durations
// ("5m0s"), not as integer nanoseconds.
func TestMaintainerLogsDurationsAsStrings(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var logs syncBuffer
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

// Under a JSON handler a reconcile verdict reads as its name ("not_done"),
// not as the integer behind it.
func TestReconciledVerdictLogsAsItsName(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	ctx := context.Background()
	var logs syncBuffer
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
	require.Equal(t, []any{"not_done"}, verdicts, logs.String())
}
