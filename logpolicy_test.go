package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
)

// attrRecorder is a slog handler that keeps every record's message and
// every attribute (groups flattened), its value as text, for a test to
// search.
type attrRecorder struct {
	mu    *sync.Mutex
	lines *[]string
	attrs []slog.Attr
}

func newAttrRecorder() *attrRecorder { return &attrRecorder{mu: &sync.Mutex{}, lines: new([]string)} }

func (h *attrRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (h *attrRecorder) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	write := func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value.Resolve().Any())
		return true
	}
	for _, a := range h.attrs {
		write(a)
	}
	r.Attrs(write)
	h.mu.Lock()
	*h.lines = append(*h.lines, b.String())
	h.mu.Unlock()
	return nil
}

func (h *attrRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	return &attrRecorder{mu: h.mu, lines: h.lines, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}

func (h *attrRecorder) WithGroup(string) slog.Handler { return h }

// containing returns the recorded lines that contain s.
func (h *attrRecorder) containing(s string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, l := range *h.lines {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

func (h *attrRecorder) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(*h.lines)
}

// Finding 4 of the security review, for the runner: with Config.LogKeys off
// (the default), no log line names a client's scope or key, in its message,
// its attributes or the error text it carries, over every path that logs
// about a key: new keys, replays, mismatches, failed phases and their
// resumption, takeovers, requests in progress, keys sent to reconcile,
// reconcile runs (done, unknown), operators' verdicts, the completer, the
// reaper and forced unlocks. With LogKeys on, the same lines do name them
// (the test can fail).
func TestNoScopeOrKeyInLogsWithoutLogKeys(t *testing.T) {
	t.Parallel()
	const scope = "tenant-SECRETSCOPE"
	rec := newAttrRecorder()
	exercise(t, scope, false, rec)
	require.Greater(t, rec.count(), 10, "the paths logged")
	require.Empty(t, rec.containing("SECRET"), "lines that name a scope or key with LogKeys off")

	withKeys := newAttrRecorder()
	exercise(t, scope, true, withKeys)
	require.NotEmpty(t, withKeys.containing(scope), "with LogKeys the lines name the scope")
	require.NotEmpty(t, withKeys.containing("SECRETKEY-failed"), "and the key")
}

// exercise runs every path that logs about a key, with keys named
// SECRETKEY-*, in scope.
func exercise(t *testing.T, scope string, logKeys bool, rec *attrRecorder) {
	t.Helper()
	b := setupSMS(t)
	ctx := context.Background()
	logger := slog.New(rec)
	cfg := func(hook func(context.Context, idemtest.HookPoint) error) *idem.Config {
		return &idem.Config{Flows: []idem.AnyFlow{b.flow, b.testBundle.flow}, Logger: logger, LogKeys: logKeys,
			Retention: time.Hour, Test: idemtest.WithHook(idem.TestConfig{}, hook)}
	}
	r := b.testBundle.runner(t, cfg(nil))
	ride := func(key string, amount float64) idem.Request {
		return idem.Request{Scope: scope, Key: "SECRETKEY-" + key, Method: "POST", Path: "/rides", Params: rideInput{Origin: "A St", Amount: amount}}
	}
	sms := func(key string) idem.Request {
		return idem.Request{Scope: scope, Key: "SECRETKEY-" + key, Params: smsInput{To: "+15550100", Text: "hi"}}
	}

	// A new key, its replay, a mismatch.
	_, err := r.Execute(ctx, b.testBundle.flow, ride("new", 1))
	require.NoError(t, err)
	_, err = r.Execute(ctx, b.testBundle.flow, ride("new", 1))
	require.NoError(t, err)
	_, err = r.Execute(ctx, b.testBundle.flow, ride("new", 2))
	require.ErrorIs(t, err, idem.ErrMismatch)

	// A failed phase whose error names the key, then its resumption.
	b.hooks["charge_created"] = func(_ context.Context, _ idem.Tx, run *idem.Attempt[rideInput]) error {
		return fmt.Errorf("provider said no to scope %q key %q", run.Key().Scope, run.Key().Key)
	}
	_, err = r.Execute(ctx, b.testBundle.flow, ride("failed", 1))
	require.Error(t, err)
	delete(b.hooks, "charge_created")
	_, err = r.Execute(ctx, b.testBundle.flow, ride("failed", 1))
	require.NoError(t, err)

	// A crash: in progress while its lease lives, taken over after, and
	// another finished by the completer.
	crashing := b.testBundle.runner(t, cfg(crashAt(idemtest.HookPhaseStart, "charge_created")))
	for _, k := range []string{"crashed", "abandoned"} {
		_, err = crashing.Execute(ctx, b.testBundle.flow, ride(k, 1))
		require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	}
	_, err = r.Execute(ctx, b.testBundle.flow, ride("crashed", 1))
	require.ErrorIs(t, err, idem.ErrInProgress)
	b.clock.Advance(2 * time.Minute)
	_, err = r.Execute(ctx, b.testBundle.flow, ride("crashed", 1))
	require.NoError(t, err)
	b.clock.Advance(time.Hour)
	_, err = r.Complete(ctx, nil)
	require.NoError(t, err)

	// Calls in doubt: reconciled as done, left unknown, resolved by an
	// operator; a forced unlock.
	for _, k := range []string{"doubt-done", "doubt-unknown", "doubt-resolved"} {
		b.gateway.lose = true
		_, err = r.Execute(ctx, b.flow, sms(k))
		require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	}
	_, err = r.Reconcile(ctx, scope, "SECRETKEY-doubt-done")
	require.NoError(t, err)
	b.gateway.unknown = true
	_, err = r.Reconcile(ctx, scope, "SECRETKEY-doubt-unknown")
	require.Error(t, err)
	_, err = r.ReconcileAll(ctx, nil)
	require.NoError(t, err)
	_, err = r.Resolve(ctx, scope, "SECRETKEY-doubt-resolved", resolution(idem.ResolveAbandon))
	require.NoError(t, err)
	_, err = r.Resolve(ctx, scope, "SECRETKEY-doubt-resolved", resolution(idem.ResolveAbandon))
	require.ErrorIs(t, err, idem.ErrNothingToReconcile)
	_, err = crashing.Execute(ctx, b.testBundle.flow, ride("unlocked", 1))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	_, err = r.UnlockKey(ctx, scope, "SECRETKEY-unlocked", "stuck")
	require.NoError(t, err)

	// The reaper.
	b.clock.Advance(48 * time.Hour)
	_, err = r.Reap(ctx, nil)
	require.NoError(t, err)
	var refused *idem.Outcome
	refused, err = r.Execute(ctx, b.testBundle.flow, idem.Request{Scope: scope, Key: "SECRETKEY-\x01bad", Params: rideInput{}})
	require.True(t, errors.Is(err, idem.ErrInvalidRequest) || refused.Kind == idem.OutcomeInvalid, "%v", err)
}

// recordingTracer records the error text of every event and of every span
// it would end, as an exporter would see them.
type recordingTracer struct {
	mu    sync.Mutex
	texts []string
}

func (o *recordingTracer) add(err error) {
	if err == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.texts = append(o.texts, err.Error())
}

func (o *recordingTracer) Observe(_ context.Context, e idem.Event) { o.add(e.Err) }

func (o *recordingTracer) StartRequest(ctx context.Context, _, _ string) (context.Context, func(*idem.Outcome, error)) {
	return ctx, func(_ *idem.Outcome, err error) { o.add(err) }
}

func (o *recordingTracer) StartPhase(ctx context.Context, _, _ string, _ int) (context.Context, func(error)) {
	return ctx, func(err error) { o.add(err) }
}

func (o *recordingTracer) all() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return strings.Join(o.texts, "\n")
}

const (
	secretScope = "tenant:acme-secret"
	secretKey   = "key-of-acme-secret"
	cardNumber  = "4111111111111111"
)

// By default the runner's log records name a key by its row id, not by its
// scope and key (Config.LogKeys adds them); and Config.RedactError rewrites
// every error text the runner persists (last_error) or exports (logs,
// observer events, spans) before it does.
func TestLogsLeaveOutKeysAndErrorsAreRedacted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.hooks["charge_created"] = func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		return errors.New("card " + cardNumber + " declined by the issuer")
	}
	var logs bytes.Buffer
	var logMu sync.Mutex
	logger := slog.New(slog.NewJSONHandler(lockedWriter{&logMu, &logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	redacted := func(err error) string {
		return strings.ReplaceAll(err.Error(), cardNumber, "[card]")
	}
	tracer := &recordingTracer{}
	r := b.runner(t, &idem.Config{Logger: logger, Observer: tracer, RedactError: redacted})
	req := idem.Request{Scope: secretScope, Key: secretKey, Params: rideInput{Origin: "SF", Amount: 5}}
	for range 2 { // a failure, then a takeover that fails again
		_, err := r.Execute(ctx, b.flow, req)
		require.ErrorContains(t, err, cardNumber, "the caller's own error is not rewritten")
	}
	rec, err := b.storeFor(t).GetKey(ctx, secretScope, secretKey)
	require.NoError(t, err)
	require.Contains(t, rec.LastError, "card [card] declined", "last_error is redacted before it is stored")

	// Abandon it, and see the reaper and a completer pass log too.
	b.clock.Advance(8 * 24 * time.Hour)
	_, err = r.Complete(ctx, &idem.CompleteConfig{IdleFor: time.Minute})
	require.NoError(t, err)
	_, err = r.Reap(ctx, nil)
	require.NoError(t, err)

	logMu.Lock()
	out := logs.String()
	logMu.Unlock()
	require.Contains(t, out, `"key_id":`)
	require.Contains(t, out, "card [card] declined")
	for _, secret := range []string{secretScope, secretKey, cardNumber} {
		require.NotContains(t, out, secret, "logs")
	}
	require.Contains(t, tracer.all(), "card [card] declined")
	require.NotContains(t, tracer.all(), cardNumber, "events and spans")

	// With LogKeys, records name the scope and key.
	logs.Reset()
	r = b.runner(t, &idem.Config{Logger: logger, LogKeys: true})
	_, err = r.Execute(ctx, b.flow, idem.Request{Scope: secretScope, Key: "k2", Params: rideInput{Origin: "SF"}})
	require.Error(t, err)
	logMu.Lock()
	out = logs.String()
	logMu.Unlock()
	require.Contains(t, out, `"scope":"`+secretScope+`"`)
	require.Contains(t, out, `"key":"k2"`)
	require.Contains(t, out, cardNumber, "without RedactError the text is as the phase wrote it")
}

// A phase whose not-idempotent call is in doubt parks its key with the
// redacted reason too.
func TestNeedsReconcileReasonIsRedacted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	flow := idem.MustNewFlow("sms.send", []idem.Phase[rideInput]{{
		Name: "sent", Foreign: idem.ForeignNotIdempotent,
		Do: func(ctx context.Context, _ idem.Tx, run *idem.Attempt[rideInput]) (idem.Result, error) {
			if err := run.Foreign(ctx, "send", func(context.Context, string) error { return nil }); err != nil {
				return idem.Result{}, err
			}
			return idem.Result{}, errors.New("lost the reply about " + cardNumber)
		},
		Reconcile: func(context.Context, idem.Tx, *idem.Attempt[rideInput]) (idem.ReconcileVerdict, error) {
			return idem.ReconcileVerdict{}, errors.New("the gateway does not know " + cardNumber)
		},
	}}, nil)
	r := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{flow}, Logger: slog.New(slog.DiscardHandler),
		RedactError: func(error) string { return "redacted" }})
	_, err := r.Execute(ctx, flow, b.request("k1", rideInput{Origin: "SF"}))
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	require.Equal(t, "redacted", b.key(t, "k1").LastError)
	_, err = r.Reconcile(ctx, "user:1", "k1")
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	require.Equal(t, "redacted", b.key(t, "k1").LastError)
}

// lockedWriter serialises writes to a buffer shared by goroutines.
type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
