package idem_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/internal/testfixture"
)

// A key of a flow the runner does not know is never claimed by its
// completer; each pass says so at warn, once per such flow, with the
// number of its running keys, so that a flow left out of Config.Flows is
// seen before its keys are reaped unfinished.
func TestCompleterWarnsOfKeysOfUnknownFlows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	other := b.rideFlow("rides.other")
	full := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{b.flow, other}})
	b.hooks["charge_created"] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		return errors.New("provider down")
	}
	for _, key := range []string{"k1", "k2"} {
		_, err := full.Execute(ctx, b.flow, b.request(key, rideInput{Origin: "SFO", Amount: 1}))
		require.ErrorIs(t, err, idem.ErrPhaseFailed)
	}
	_, err := full.Execute(ctx, other, b.request("k3", rideInput{Origin: "SFO", Amount: 1}))
	require.ErrorIs(t, err, idem.ErrPhaseFailed)

	var logs testfixture.Buffer
	known := b.rideFlow("rides.known")
	partial := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{known}, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	for range 2 {
		res, err := partial.Complete(ctx, nil)
		require.NoError(t, err)
		require.Zero(t, res.Claimed)
	}
	warned := map[string][]float64{}
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var line map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line))
		if strings.Contains(line["msg"].(string), "does not know") {
			require.Equal(t, "WARN", line["level"])
			warned[line["flow"].(string)] = append(warned[line["flow"].(string)], line["keys"].(float64))
		}
	}
	require.Equal(t, map[string][]float64{"rides.create": {2, 2}, "rides.other": {1, 1}}, warned, logs.String())

	// The runner that knows them warns of nothing.
	var awareLogs testfixture.Buffer
	aware := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{b.flow, other}, Logger: slog.New(slog.NewJSONHandler(&awareLogs, nil))})
	_, err = aware.Complete(ctx, nil)
	require.NoError(t, err)
	require.NotContains(t, awareLogs.String(), "does not know")
}
