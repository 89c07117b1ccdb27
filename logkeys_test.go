package idem_test

import (
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
