// Package idemotel reports idem's events to OpenTelemetry: counters and
// duration histograms through a MeterProvider, and a span per request and
// per phase attempt through a TracerProvider. The core package does not
// depend on OpenTelemetry; this adapter plugs into its observer hook:
//
//	obs, err := idemotel.New(nil) // the global providers
//	runner, err := idem.NewRunner(store, &idem.Config{Observer: obs})
//
// # Metrics
//
//	idem.events            counter    every event, by idem.event (created,
//	                                  replayed, in_progress, mismatch,
//	                                  takeover, lock_lost, phase_retried,
//	                                  needs_reconcile, store_error, completed,
//	                                  reaped, ...), idem.flow and idem.phase;
//	                                  reconciled events also by idem.verdict
//	                                  (happened, not_happened, unknown)
//	idem.keys.reaped       counter    keys deleted by the reaper
//	idem.request.duration  histogram  seconds per Runner.Execute, by idem.flow and
//	                                  idem.outcome (executed, replayed, ...)
//	idem.phase.duration    histogram  seconds per phase attempt, by idem.flow,
//	                                  idem.phase and idem.phase.result (ok, error)
//
// and, once [Observer.ObserveBacklog] is given a runner, two gauges read
// from the database at each collection:
//
//	idem.keys              gauge      unfinished keys, by idem.status (running,
//	                                  needs_reconcile)
//	idem.keys.oldest_age   gauge      seconds since the oldest unfinished key of
//	                                  each idem.status was created
//
// and, once [Observer.ObserveDetached] is given a process's
// idemhttp.DetachedRuns, two gauges of that process's flows running without
// their client:
//
//	idem.detached.running  gauge      flows running without their client now
//	idem.detached.limit    gauge      the most that may
//
// A Prometheus exporter shows them as idem_events_total{idem_event=...},
// idem_keys_reaped_total, idem_request_duration_seconds,
// idem_phase_duration_seconds, idem_keys{idem_status=...} and
// idem_keys_oldest_age_seconds.
//
// Attributes are bounded by the number of flows, phases and event kinds;
// scopes and keys, which are not, never become metric attributes.
//
// # Traces
//
// Each Runner.Execute gets a span "idem.request <flow>" and each phase attempt a
// child span "idem.phase <phase>", so the phase's own database spans (from a
// pgx tracer) nest under it. Events other than heartbeats are added to the
// current span (a takeover, a lost lock, a retry), and failed attempts
// record their error.
package idemotel

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/go-idem/idem/idemotel"

// Attribute keys.
const (
	AttrEvent         = attribute.Key("idem.event")
	AttrFlow          = attribute.Key("idem.flow")
	AttrPhase         = attribute.Key("idem.phase")
	AttrPhaseResult   = attribute.Key("idem.phase.result")
	AttrOutcome       = attribute.Key("idem.outcome")
	AttrAttempt       = attribute.Key("idem.attempt")
	AttrScope         = attribute.Key("idem.scope")
	AttrKeyID         = attribute.Key("idem.key.id")
	AttrRecoveryPoint = attribute.Key("idem.recovery_point")
	AttrTookOver      = attribute.Key("idem.took_over")
	AttrCount         = attribute.Key("idem.count")
	// AttrVerdict is a reconcile hook's verdict (happened, not_happened, unknown)
	// on idem.events{idem.event="reconciled"}.
	AttrVerdict = attribute.Key("idem.verdict")
	// AttrStatus is a key status (running, needs_reconcile) on the backlog
	// gauges.
	AttrStatus = attribute.Key("idem.status")
)

// Config configures an [Observer]. The zero value uses the global providers.
type Config struct {
	// MeterProvider makes the instruments. Default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider makes the spans. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// SpanScope adds the request's scope (the tenant or user the key
	// belongs to) to request spans as idem.scope. Off by default: scopes
	// are often user identifiers.
	SpanScope bool
}

// Observer implements idem.Observer and idem.Tracer. It is safe for
// concurrent use; share one among the runners of a process.
type Observer struct {
	tracer    trace.Tracer
	meter     metric.Meter
	spanScope bool

	events          metric.Int64Counter
	reaped          metric.Int64Counter
	requestDuration metric.Float64Histogram
	phaseDuration   metric.Float64Histogram
}

var (
	_ idem.Observer = (*Observer)(nil)
	_ idem.Tracer   = (*Observer)(nil)
)

// durationBuckets suit requests and phases of a few milliseconds to
// several seconds (the OpenTelemetry HTTP duration buckets).
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// New returns an Observer. A nil config means the global providers.
func New(config *Config) (*Observer, error) {
	cfg := Config{}
	if config != nil {
		cfg = *config
	}
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = otel.GetMeterProvider()
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	meter := cfg.MeterProvider.Meter(ScopeName)
	o := &Observer{tracer: cfg.TracerProvider.Tracer(ScopeName), meter: meter, spanScope: cfg.SpanScope}
	var errs []error
	var err error
	o.events, err = meter.Int64Counter("idem.events", metric.WithUnit("{event}"),
		metric.WithDescription("idem runner and maintenance events, by kind (idem.event)"))
	errs = append(errs, err)
	o.reaped, err = meter.Int64Counter("idem.keys.reaped", metric.WithUnit("{key}"),
		metric.WithDescription("expired finished keys deleted by the reaper"))
	errs = append(errs, err)
	o.requestDuration, err = meter.Float64Histogram("idem.request.duration", metric.WithUnit("s"),
		metric.WithDescription("duration of Runner.Execute, acquisition to outcome"), metric.WithExplicitBucketBoundaries(durationBuckets...))
	errs = append(errs, err)
	o.phaseDuration, err = meter.Float64Histogram("idem.phase.duration", metric.WithUnit("s"),
		metric.WithDescription("duration of a phase attempt, begin to commit or rollback"), metric.WithExplicitBucketBoundaries(durationBuckets...))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("idemotel: create instruments: %w", err)
	}
	return o, nil
}

// Observe implements idem.Observer: it counts the event and adds it to the
// current span.
func (o *Observer) Observe(ctx context.Context, e idem.Event) {
	attrs := make([]attribute.KeyValue, 0, 4)
	attrs = append(attrs, AttrEvent.String(string(e.Kind)))
	if e.Flow != "" {
		attrs = append(attrs, AttrFlow.String(e.Flow))
	}
	if e.Phase != "" {
		attrs = append(attrs, AttrPhase.String(e.Phase))
	}
	if (e.Kind == idem.EventReconciled || e.Kind == idem.EventResolved) && e.Verdict != "" {
		attrs = append(attrs, AttrVerdict.String(e.Verdict))
	}
	o.events.Add(ctx, 1, metric.WithAttributes(attrs...))
	if e.Kind == idem.EventReaped {
		o.reaped.Add(ctx, int64(e.Count))
	}

	if e.Kind == idem.EventHeartbeat {
		return
	}
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	spanAttrs := attrs[1:]
	if e.Attempt > 0 {
		spanAttrs = append(spanAttrs, AttrAttempt.Int(e.Attempt))
	}
	if e.Count > 0 {
		spanAttrs = append(spanAttrs, AttrCount.Int(e.Count))
	}
	if e.Err != nil {
		spanAttrs = append(spanAttrs, attribute.String("error.message", e.Err.Error()))
	}
	span.AddEvent("idem."+string(e.Kind), trace.WithAttributes(spanAttrs...))
}

// StartRequest implements idem.Tracer.
func (o *Observer) StartRequest(ctx context.Context, flow, scope string) (context.Context, func(*idem.Outcome, error)) {
	attrs := []attribute.KeyValue{AttrFlow.String(flow)}
	if o.spanScope {
		attrs = append(attrs, AttrScope.String(scope))
	}
	ctx, span := o.tracer.Start(ctx, "idem.request "+flow, trace.WithAttributes(attrs...))
	started := time.Now()
	return ctx, func(out *idem.Outcome, err error) {
		kind := idem.OutcomeKind("unknown")
		if out != nil {
			kind = out.Kind
			span.SetAttributes(AttrOutcome.String(string(kind)), AttrTookOver.Bool(out.TookOver))
			if out.Record != nil {
				span.SetAttributes(AttrKeyID.Int64(out.Record.ID), AttrRecoveryPoint.String(out.Record.RecoveryPoint))
			}
		}
		if failure(kind) {
			span.RecordError(err)
			span.SetStatus(codes.Error, string(kind))
		}
		span.End()
		o.requestDuration.Record(ctx, time.Since(started).Seconds(),
			metric.WithAttributes(AttrFlow.String(flow), AttrOutcome.String(string(kind))))
	}
}

// StartPhase implements idem.Tracer.
func (o *Observer) StartPhase(ctx context.Context, flow, phase string, attempt int) (context.Context, func(error)) {
	ctx, span := o.tracer.Start(ctx, "idem.phase "+phase,
		trace.WithAttributes(AttrFlow.String(flow), AttrPhase.String(phase), AttrAttempt.Int(attempt)))
	started := time.Now()
	return ctx, func(err error) {
		result := "ok"
		if err != nil {
			result = "error"
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
		o.phaseDuration.Record(ctx, time.Since(started).Seconds(),
			metric.WithAttributes(AttrFlow.String(flow), AttrPhase.String(phase), AttrPhaseResult.String(result)))
	}
}

// failure reports whether an outcome is the server's failure, as opposed to
// an answer the client caused or must wait for (a replay, a 409, a 422).
func failure(kind idem.OutcomeKind) bool {
	switch kind {
	case idem.OutcomeFailed, idem.OutcomeStoreUnavailable, idem.OutcomeLockLost, "unknown":
		return true
	}
	return false
}

// Backlogger is what [Observer.ObserveBacklog] reads: *idem.Runner.
type Backlogger interface {
	Backlog(ctx context.Context) (*idemtype.Backlog, error)
}

// ObserveBacklog registers the backlog gauges, idem.keys and
// idem.keys.oldest_age by idem.status, read from runner at each collection
// (one statement over the unfinished keys, through a partial index). The
// backlog is the database's, not the process's: every instance that
// registers reports the same numbers, so register on one (the one running
// the Maintainer, say) or aggregate them with max, not sum. Unregister the
// returned registration to stop.
func (o *Observer) ObserveBacklog(runner Backlogger) (metric.Registration, error) {
	keys, err := o.meter.Int64ObservableGauge("idem.keys", metric.WithUnit("{key}"),
		metric.WithDescription("unfinished idem keys, by status (idem.status)"))
	if err != nil {
		return nil, fmt.Errorf("idemotel: create idem.keys: %w", err)
	}
	age, err := o.meter.Float64ObservableGauge("idem.keys.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("seconds since the oldest unfinished idem key of each status (idem.status) was created"))
	if err != nil {
		return nil, fmt.Errorf("idemotel: create idem.keys.oldest_age: %w", err)
	}
	reg, err := o.meter.RegisterCallback(func(ctx context.Context, obs metric.Observer) error {
		b, err := runner.Backlog(ctx)
		if err != nil {
			return err
		}
		for _, st := range b.Statuses {
			attrs := metric.WithAttributes(AttrStatus.String(string(st.Status)))
			obs.ObserveInt64(keys, st.Keys, attrs)
			obs.ObserveFloat64(age, b.OldestAge(st.Status).Seconds(), attrs)
		}
		return nil
	}, keys, age)
	if err != nil {
		return nil, fmt.Errorf("idemotel: register the backlog gauges: %w", err)
	}
	return reg, nil
}

// DetachedCounter is what [Observer.ObserveDetached] reads:
// *idemhttp.DetachedRuns.
type DetachedCounter interface {
	Running() int
	Limit() int
}

// ObserveDetached registers the gauges of a process's flows running
// without their client (idemhttp's DetachedRuns: requests answered 202
// Accepted, and requests whose client went away), read at each
// collection: idem.detached.running and idem.detached.limit. Unlike the
// backlog, they are the process's own: sum them across instances. Unregister
// the returned registration to stop.
func (o *Observer) ObserveDetached(runs DetachedCounter) (metric.Registration, error) {
	running, err := o.meter.Int64ObservableGauge("idem.detached.running", metric.WithUnit("{request}"),
		metric.WithDescription("flows this process runs without their client (answered 202, or their client left)"))
	if err != nil {
		return nil, fmt.Errorf("idemotel: create idem.detached.running: %w", err)
	}
	limit, err := o.meter.Int64ObservableGauge("idem.detached.limit", metric.WithUnit("{request}"),
		metric.WithDescription("the most flows this process runs without their client at once"))
	if err != nil {
		return nil, fmt.Errorf("idemotel: create idem.detached.limit: %w", err)
	}
	reg, err := o.meter.RegisterCallback(func(_ context.Context, obs metric.Observer) error {
		obs.ObserveInt64(running, int64(runs.Running()))
		obs.ObserveInt64(limit, int64(runs.Limit()))
		return nil
	}, running, limit)
	if err != nil {
		return nil, fmt.Errorf("idemotel: register the detached gauges: %w", err)
	}
	return reg, nil
}
