package idem

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// Observer receives the runner's events: counts (one event each) and
// durations. It is called synchronously, on the request's goroutine or, for
// heartbeats, on the lease's own goroutine concurrently with it, so it
// must be fast and must not block; aggregate and export elsewhere. The
// idemotel package adapts it to OpenTelemetry metrics.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// ObserverFunc adapts a function to [Observer].
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f.
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// redactedError is an error whose text Config.RedactError rewrote; it still
// wraps the original, for errors.Is.
type redactedError struct {
	text string
	err  error
}

func (e *redactedError) Error() string { return e.text }
func (e *redactedError) Unwrap() error { return e.err }

// redact is err as the runner exports it: with the text Config.RedactError
// gives it.
func (r *Runner) redact(err error) error {
	if err == nil || r.config.RedactError == nil {
		return err
	}
	if _, done := err.(*redactedError); done {
		return err
	}
	return &redactedError{text: r.config.RedactError(err), err: err}
}

// logErr is err as a log line about the key (scope, key) shows it:
// redacted, and, unless Config.LogKeys, with the key's own text replaced:
// the runner's errors name a key as `key "..."` (or `scope "..." key
// "..."`), which their callers know anyway, but the line carries its
// key_id instead.
func (r *Runner) logErr(err error, scope, key string) error {
	err = r.redact(err)
	if err == nil || r.config.LogKeys {
		return err
	}
	text := err.Error()
	if keyless := r.keyless(text, scope, key); keyless != text {
		return &redactedError{text: keyless, err: err}
	}
	return err
}

// keyless is text with the key's and the scope's own text replaced, as
// errors quote them (`scope "..." key "..."`, `key "..."`, `scope
// "..."`), unless Config.LogKeys.
func (r *Runner) keyless(text, scope, key string) string {
	if r.config.LogKeys {
		return text
	}
	pairs := []string{fmt.Sprintf("scope %q key %q", scope, key), "the key", fmt.Sprintf("key %q", key), "the key"}
	if scope != "" {
		pairs = append(pairs, fmt.Sprintf("scope %q", scope), "the scope")
	}
	return strings.NewReplacer(pairs...).Replace(text)
}

// errorText is err's text as the runner persists it (last_error).
func (r *Runner) errorText(err error) string {
	return r.redact(err).Error()
}

// logAttrs are the attributes of a log record about a key: its row id when
// known (0: not), its scope and key only with Config.LogKeys, then attrs,
// whose errors and texts (an error, a last error, a reason) go through
// logErr and keyless: every line about a key applies the policy to all it
// carries, not only to the attributes that name the key.
func (r *Runner) logAttrs(scope, key string, id int64, attrs ...any) []any {
	out := make([]any, 0, len(attrs)+4)
	if id != 0 {
		out = append(out, "key_id", id)
	}
	if r.config.LogKeys {
		return append(append(out, "scope", scope, "key", key), attrs...)
	}
	for i := 0; i < len(attrs); i++ {
		if a, ok := attrs[i].(slog.Attr); ok {
			out = append(out, a)
			continue
		}
		out = append(out, attrs[i]) // a key; its value follows
		if i++; i < len(attrs) {
			switch v := attrs[i].(type) {
			case error:
				out = append(out, r.logErr(v, scope, key))
			case string:
				out = append(out, r.keyless(v, scope, key))
			default:
				out = append(out, v)
			}
		}
	}
	return out
}

// Tracer is an optional extension of [Observer]: when the Config.Observer
// also implements it, the runner opens a span per request and per phase
// attempt, and runs the request and the phase inside the returned contexts
// (so database tracing nests under them). end receives the attempt's error.
type Tracer interface {
	StartRequest(ctx context.Context, flow, scope string) (context.Context, func(out *Outcome, err error))
	StartPhase(ctx context.Context, flow, phase string, attempt int) (context.Context, func(err error))
}

// EventKind names an event.
type EventKind string

// Events. Request-level events carry Flow, Scope and Key; phase-level events
// also Phase and Attempt; maintenance events carry Count.
const (
	EventCreated          EventKind = "created"           // a new key was inserted and locked
	EventTakeover         EventKind = "takeover"          // an unfinished key was resumed
	EventReplayed         EventKind = "replayed"          // a stored response was replayed
	EventInProgress       EventKind = "in_progress"       // a live lease turned the request away
	EventMismatch         EventKind = "mismatch"          // a key was reused for a different request
	EventNeedsReconcile   EventKind = "needs_reconcile"   // a key was found or put in needs_reconcile (by the reaper: Count keys)
	EventLockLost         EventKind = "lock_lost"         // this worker's lease was taken over
	EventStoreError       EventKind = "store_error"       // a store operation failed
	EventPhaseCommitted   EventKind = "phase_committed"   // Duration: the phase attempt, begin to commit
	EventPhaseRetried     EventKind = "phase_retried"     // a serialization failure or deadlock is being retried
	EventPhaseFailed      EventKind = "phase_failed"      // a phase returned an error or panicked; Err says
	EventFinished         EventKind = "finished"          // Duration: the whole call, acquisition to response
	EventHeartbeat        EventKind = "heartbeat"         // a lease was renewed
	EventReconciled       EventKind = "reconciled"        // a reconcile hook gave a verdict (Err nil) or failed
	EventResolved         EventKind = "resolved"          // an operator's verdict was applied (Runner.Resolve); Verdict says which
	EventReaped           EventKind = "reaped"            // Count: expired finished keys deleted
	EventReapedUnfinished EventKind = "reaped_unfinished" // Count: unfinished keys past their UnfinishedRetention deleted
	EventTooManyKeys      EventKind = "too_many_keys"     // Config.Admit refused a new key
	EventCompleted        EventKind = "completed"         // a request whose client gave up was driven to a response
	EventUnresumable      EventKind = "unresumable"       // Count: keys at Phase (a recovery point) this binary cannot resume (Runner.CheckResumable)
)

// Event is one observation.
type Event struct {
	Kind     EventKind
	Flow     string
	Scope    string
	Key      string
	Phase    string
	Attempt  int
	Count    int
	Duration time.Duration
	Err      error
	// Verdict is a reconcile hook's answer on EventReconciled: "happened",
	// "not_happened" or "unknown" (Err then says why); an operator's on
	// EventResolved: "happened", "not_happened" or "abandon".
	Verdict string
}
