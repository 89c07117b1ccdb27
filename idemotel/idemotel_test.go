package idemotel_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemotel"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/pgstore"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type input struct {
	Fail bool `json:"fail"`
}

var errBoom = errors.New("boom")

// bundle is a runner on a database of its own, observed through idemotel
// into in-memory readers.
type bundle struct {
	runner *idem.Runner
	obs    *idemotel.Observer
	flow   *idem.Flow[input]
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	now    time.Time
}

func setup(t *testing.T, spanScope bool) *bundle {
	t.Helper()
	schema := pgtest.NewMigratedSchema(t)
	store, err := pgstore.New(schema.Pool, &pgstore.Config{Schema: schema.Name})
	require.NoError(t, err)
	t.Cleanup(store.Close)

	b := &bundle{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder(), now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	obs, err := idemotel.New(&idemotel.Config{
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(b.reader)),
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b.spans)),
		SpanScope:      spanScope,
	})
	require.NoError(t, err)
	b.obs = obs
	b.flow = idem.MustNewFlow("orders.create", []idem.Phase[input]{
		{Name: "reserved", Do: func(context.Context, idem.Tx, *idem.Attempt[input]) (idem.Result, error) {
			return idem.Advance(), nil
		}},
		{Name: "responded", Do: func(_ context.Context, _ idem.Tx, run *idem.Attempt[input]) (idem.Result, error) {
			if run.Input().Fail {
				return idem.Result{}, errBoom
			}
			return idem.RespondJSON(http.StatusCreated, "ok"), nil
		}},
	}, nil)
	b.runner, err = idem.NewRunner(store, &idem.Config{
		Observer: obs, Flows: []idem.AnyFlow{b.flow}, Retention: time.Hour, Logger: slog.New(slog.DiscardHandler),
		Test: idem.TestConfig{Now: func() time.Time { return b.now }},
	})
	require.NoError(t, err)
	return b
}

func (b *bundle) run(t *testing.T, key string, fail bool) (*idem.Outcome, error) {
	t.Helper()
	return b.runner.Execute(context.Background(), b.flow, idem.Request{Scope: "user:1", Key: key, Params: input{Fail: fail}})
}

func (b *bundle) metrics(t *testing.T) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, b.reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, idemotel.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// eventCounts sums idem.events by event kind (and phase, when set).
func eventCounts(t *testing.T, data metricdata.Aggregation) map[string]int64 {
	t.Helper()
	sum, ok := data.(metricdata.Sum[int64])
	require.True(t, ok, "idem.events is an int64 sum, got %T", data)
	require.True(t, sum.IsMonotonic)
	out := map[string]int64{}
	for _, dp := range sum.DataPoints {
		kind, _ := dp.Attributes.Value(idemotel.AttrEvent)
		name := kind.AsString()
		if phase, ok := dp.Attributes.Value(idemotel.AttrPhase); ok {
			name += "/" + phase.AsString()
		}
		if flow, ok := dp.Attributes.Value(idemotel.AttrFlow); ok {
			require.Equal(t, "orders.create", flow.AsString())
		}
		require.False(t, dp.Attributes.HasValue(idemotel.AttrScope), "scopes never become metric attributes")
		out[name] += dp.Value
	}
	return out
}

// histogramCounts counts histogram observations by one attribute.
func histogramCounts(t *testing.T, data metricdata.Aggregation, by attribute.Key) map[string]uint64 {
	t.Helper()
	h, ok := data.(metricdata.Histogram[float64])
	require.True(t, ok, "a float64 histogram, got %T", data)
	out := map[string]uint64{}
	for _, dp := range h.DataPoints {
		v, _ := dp.Attributes.Value(by)
		out[v.AsString()] += dp.Count
		require.GreaterOrEqual(t, dp.Sum, 0.0)
	}
	return out
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	ctx := context.Background()

	_, err := b.run(t, "k1", false)
	require.NoError(t, err)
	out, err := b.run(t, "k1", false)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
	_, err = b.run(t, "k1", true)
	require.ErrorIs(t, err, idem.ErrMismatch)
	_, err = b.run(t, "k2", true)
	require.ErrorIs(t, err, idem.ErrPhaseFailed)

	m := b.metrics(t)
	events := eventCounts(t, m["idem.events"])
	require.Equal(t, map[string]int64{
		"created":                   2,
		"phase_committed/reserved":  2,
		"phase_committed/responded": 1,
		"phase_failed/responded":    1,
		"finished":                  1,
		"replayed":                  1,
		"mismatch":                  1,
	}, events)
	require.Equal(t, map[string]uint64{"executed": 1, "replayed": 1, "mismatch": 1, "failed": 1},
		histogramCounts(t, m["idem.request.duration"], idemotel.AttrOutcome))
	require.Equal(t, map[string]uint64{"ok": 3, "error": 1},
		histogramCounts(t, m["idem.phase.duration"], idemotel.AttrPhaseResult))
	require.Equal(t, map[string]uint64{"reserved": 2, "responded": 2},
		histogramCounts(t, m["idem.phase.duration"], idemotel.AttrPhase))

	// Maintenance: the completer finishes k2 once it can, the reaper
	// deletes k1 once it expires.
	_, err = b.runner.Complete(ctx, &idem.CompleteConfig{IdleFor: time.Minute})
	require.NoError(t, err)
	b.now = b.now.Add(2 * time.Hour)
	res, err := b.runner.Reap(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 1, res.Deleted)

	m = b.metrics(t)
	events = eventCounts(t, m["idem.events"])
	require.Equal(t, int64(1), events["reaped"])
	reaped, ok := m["idem.keys.reaped"].(metricdata.Sum[int64])
	require.True(t, ok)
	require.Len(t, reaped.DataPoints, 1)
	require.Equal(t, int64(1), reaped.DataPoints[0].Value)
	require.Zero(t, events["completed"], "k2's last phase fails every time: nothing completed")
}

// The events maintenance emits rarely, driven into the observer directly.
func TestMaintenanceEventsAreCounted(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	obs, err := idemotel.New(&idemotel.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	require.NoError(t, err)
	ctx := context.Background()
	obs.Observe(ctx, idem.Event{Kind: idem.EventCompleted, Flow: "orders.create", Key: "k", Scope: "s", Duration: time.Second})
	obs.Observe(ctx, idem.Event{Kind: idem.EventStoreError, Err: errBoom})
	obs.Observe(ctx, idem.Event{Kind: idem.EventNeedsReconcile, Flow: "orders.create", Phase: "reserved"})
	obs.Observe(ctx, idem.Event{Kind: idem.EventReaped, Count: 500})
	obs.Observe(ctx, idem.Event{Kind: idem.EventReaped, Count: 20})

	b := &bundle{reader: reader}
	m := b.metrics(t)
	require.Equal(t, map[string]int64{"completed": 1, "store_error": 1, "needs_reconcile/reserved": 1, "reaped": 2},
		eventCounts(t, m["idem.events"]))
	reaped, ok := m["idem.keys.reaped"].(metricdata.Sum[int64])
	require.True(t, ok)
	require.Len(t, reaped.DataPoints, 1)
	require.Equal(t, int64(520), reaped.DataPoints[0].Value)
}

func TestSpans(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	_, err := b.run(t, "k1", false)
	require.NoError(t, err)
	_, err = b.run(t, "k2", true)
	require.ErrorIs(t, err, idem.ErrPhaseFailed)

	spans := b.spans.Ended()
	require.Len(t, spans, 6, "two requests, each with two phase spans")
	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()] = append(byName[s.Name()], s)
	}
	requests := byName["idem.request orders.create"]
	require.Len(t, requests, 2)
	require.Len(t, byName["idem.phase reserved"], 2)
	require.Len(t, byName["idem.phase responded"], 2)

	attrs := func(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
		out := map[attribute.Key]attribute.Value{}
		for _, kv := range s.Attributes() {
			out[kv.Key] = kv.Value
		}
		return out
	}
	for _, req := range requests {
		a := attrs(req)
		require.Equal(t, "orders.create", a[idemotel.AttrFlow].AsString())
		require.Equal(t, "user:1", a[idemotel.AttrScope].AsString(), "SpanScope is on")
		phases := 0
		for _, s := range spans {
			if s.Parent().SpanID() == req.SpanContext().SpanID() {
				phases++
				require.Equal(t, req.SpanContext().TraceID(), s.SpanContext().TraceID())
			}
		}
		require.Equal(t, 2, phases, "the phase spans are children of their request's")

		eventNames := []string{}
		for _, ev := range req.Events() {
			eventNames = append(eventNames, ev.Name)
		}
		switch a[idemotel.AttrOutcome].AsString() {
		case "executed":
			require.Equal(t, codes.Unset, req.Status().Code)
			require.Equal(t, "finished", a[idemotel.AttrRecoveryPoint].AsString())
			require.Contains(t, eventNames, "idem.created")
		case "failed":
			require.Equal(t, codes.Error, req.Status().Code)
			require.Contains(t, eventNames, "idem.phase_failed")
		default:
			t.Fatalf("unexpected outcome %v", a[idemotel.AttrOutcome])
		}
	}
	var failed int
	for _, s := range byName["idem.phase responded"] {
		a := attrs(s)
		require.Equal(t, int64(1), a[idemotel.AttrAttempt].AsInt64())
		if s.Status().Code == codes.Error {
			failed++
			require.Contains(t, s.Status().Description, "boom")
			require.NotEmpty(t, s.Events(), "the error is recorded on the span")
		}
	}
	require.Equal(t, 1, failed)
}

func TestScopeIsNotOnSpansByDefault(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	_, err := b.run(t, "k1", false)
	require.NoError(t, err)
	for _, s := range b.spans.Ended() {
		for _, kv := range s.Attributes() {
			require.NotEqual(t, idemotel.AttrScope, kv.Key)
		}
	}
}

// Reconciled events carry the hook's verdict as idem.verdict, so a
// dashboard tells settled keys (done, not_done) from hooks that cannot tell
// (unknown).
func TestReconciledEventsCarryTheVerdict(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	obs, err := idemotel.New(&idemotel.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	require.NoError(t, err)
	ctx := context.Background()
	for _, v := range []string{"happened", "not_happened", "unknown", "unknown"} {
		obs.Observe(ctx, idem.Event{Kind: idem.EventReconciled, Flow: "orders.create", Phase: "reserved", Verdict: v})
	}
	obs.Observe(ctx, idem.Event{Kind: idem.EventCompleted, Flow: "orders.create"})

	b := &bundle{reader: reader}
	sum, ok := b.metrics(t)["idem.events"].(metricdata.Sum[int64])
	require.True(t, ok)
	byVerdict := map[string]int64{}
	for _, dp := range sum.DataPoints {
		kind, _ := dp.Attributes.Value(idemotel.AttrEvent)
		v, ok := dp.Attributes.Value(idemotel.AttrVerdict)
		require.Equal(t, kind.AsString() == "reconciled", ok, "only reconciled events carry a verdict")
		if ok {
			byVerdict[v.AsString()] += dp.Value
		}
	}
	t.Logf("idem.events{idem.event=reconciled} by idem.verdict: %v", byVerdict)
	require.Equal(t, map[string]int64{"happened": 1, "not_happened": 1, "unknown": 2}, byVerdict)
}

// The backlog gauges read the unfinished keys at each collection.
func TestBacklogGauges(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	reg, err := b.obs.ObserveBacklog(b.runner)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Unregister() })

	_, err = b.run(t, "k1", true) // its last phase fails: the key stays running
	require.ErrorIs(t, err, idem.ErrPhaseFailed)
	b.now = b.now.Add(90 * time.Second)

	m := b.metrics(t)
	gaugeBy := func(name string) map[string]float64 {
		out := map[string]float64{}
		switch g := m[name].(type) {
		case metricdata.Gauge[int64]:
			for _, dp := range g.DataPoints {
				v, _ := dp.Attributes.Value(idemotel.AttrStatus)
				out[v.AsString()] = float64(dp.Value)
			}
		case metricdata.Gauge[float64]:
			for _, dp := range g.DataPoints {
				v, _ := dp.Attributes.Value(idemotel.AttrStatus)
				out[v.AsString()] = dp.Value
			}
		default:
			t.Fatalf("%s is a gauge, got %T", name, m[name])
		}
		return out
	}
	keys, age := gaugeBy("idem.keys"), gaugeBy("idem.keys.oldest_age")
	t.Logf("idem.keys %v; idem.keys.oldest_age %v", keys, age)
	require.Equal(t, map[string]float64{"running": 1, "needs_reconcile": 0}, keys)
	require.Equal(t, map[string]float64{"running": 90, "needs_reconcile": 0}, age)
}

// fixedRuns is a DetachedCounter that reports what it holds.
type fixedRuns struct{ running, limit int }

func (f *fixedRuns) Running() int { return f.running }
func (f *fixedRuns) Limit() int   { return f.limit }

// The detached gauges read the process's runs without a client at each
// collection.
func TestDetachedGauges(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	obs, err := idemotel.New(&idemotel.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	require.NoError(t, err)
	runs := &fixedRuns{running: 3, limit: 1000}
	reg, err := obs.ObserveDetached(runs)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Unregister() })

	b := &bundle{reader: reader}
	gauge := func(name string) int64 {
		g, ok := b.metrics(t)[name].(metricdata.Gauge[int64])
		require.True(t, ok, "%s is an int64 gauge", name)
		require.Len(t, g.DataPoints, 1)
		return g.DataPoints[0].Value
	}
	require.EqualValues(t, 3, gauge("idem.detached.running"))
	require.EqualValues(t, 1000, gauge("idem.detached.limit"))
	runs.running = 0
	require.Zero(t, gauge("idem.detached.running"), "read at each collection")
}
