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
