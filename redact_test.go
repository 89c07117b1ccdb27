package idem_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
)

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
