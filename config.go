package idem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/hooks"
	"github.com/jackc/pgx/v5"
)

// Config configures a [Runner]. The zero value is usable: every field
// documents its default, and [NewRunner] fills defaults in on a copy.
type Config struct {
	// Lease is how long an acquisition owns a key without renewing it. A
	// worker that dies holds the key at most this long; a retry inside the
	// lease gets ErrInProgress, after it takes over. Default 90s (as in
	// rocket-rides-atomic).
	Lease time.Duration

	// HeartbeatInterval is how often a running request renews its lease, so
	// a slow but live phase is never taken over. Must be shorter than Lease.
	// Default Lease/3.
	HeartbeatInterval time.Duration

	// MaxRetryAfter caps the Outcome.RetryAfter suggested for a key in
	// progress. The holder's remaining lease bounds the wait only for a dead
	// holder; a live one usually finishes long before, and a client told to
	// wait out a 90 s lease would wait for nothing. Default 2s.
	MaxRetryAfter time.Duration

	// MaxWaiters bounds how many requests of this runner (make one per
	// process) wait at once for a key in flight (Request.Wait). A waiter
	// costs the database nothing while it waits (the store checks each
	// watched key once per tick, however many wait), and when the attempt
	// ends its waiters share one acquisition; a request beyond the
	// bound is answered ErrInProgress at once, without waiting, as it would
	// be without Wait. Default 1000; negative: no bound.
	MaxWaiters int

	// Retention is how long a finished key is kept and replayed before the
	// reaper may delete it, unless its flow sets FlowConfig.Retention.
	// Default 24h.
	Retention time.Duration

	// UnfinishedRetention is how long after its creation an unfinished key
	// (status running: its request keeps failing, or its client gave up and
	// the completer could not or may not finish it) is kept: past it, the
	// reaper deletes it, unless a live lease holds it. Keys in
	// needs_reconcile are never deleted so: whether their foreign call
	// happened is for a reconcile run or an operator to settle. A request
	// with a key so deleted runs as a new request, from its first phase.
	// FlowConfig.UnfinishedRetention overrides it per flow. Default 7 days
	// (UnfinishedRetentionDefault); negative keeps unfinished keys forever.
	// At least Lease when positive.
	UnfinishedRetention time.Duration

	// Admit, when set, is asked before a request creates a new key (never
	// for a retry of an existing one, which is always let through), so a
	// service can cap the keys of a scope (tenant): return
	// TooManyKeys(retryAfter) to refuse the request with ErrTooManyKeys
	// (OutcomeTooManyKeys, answered 429 with Retry-After by idemhttp);
	// nothing is written. Any other error fails the request, also without
	// writing anything. It costs a new key one more acquisition statement.
	Admit func(ctx context.Context, scope, flow string) error

	// Isolation is the default isolation level of phase transactions:
	// read committed (the default), repeatable read or serializable. Every
	// phase works at each: the guarded commit updates only the key's
	// progress, which heartbeats and foreign marks do not write, so a phase
	// that outlives heartbeats or makes a not-idempotent call after a
	// statement of its own commits without a serialization failure. At
	// repeatable read and serializable the guard conflicts only with a
	// takeover or a forced unlock, which moved the fence: the retry then
	// finds it moved and stops with ErrLockLost. Serialization failures of
	// the phase's own statements are retried (MaxPhaseRetries), except after
	// a not-idempotent call.
	Isolation pgx.TxIsoLevel

	// StatementTimeout bounds each of the runner's own round trips to the
	// store: the acquisition, beginning a phase, a foreign mark, a
	// heartbeat, a phase commit, a release, parking a key for reconcile and
	// re-reading a key whose commit reply was lost. One that gets no answer
	// in time is ErrStoreUnavailable (a 503 at the HTTP layer), so a
	// database that stalls instead of refusing connections still gets every
	// request an answer. Default StatementTimeoutDefault (5s).
	StatementTimeout time.Duration

	// PhaseStatementTimeout bounds each statement a phase sends through its
	// Tx: the server's statement_timeout, which pgstore sets once per
	// connection of the pool (per transaction behind a transaction pooler),
	// and a client deadline a second later. Raise it for a phase that
	// legitimately runs long statements. Default StatementTimeout.
	PhaseStatementTimeout time.Duration

	// LeaseMargin is how close to the end of its lease a worker stops
	// trusting it: before a foreign call, a worker that has not renewed its
	// lease for longer than Lease minus LeaseMargin (a long GC pause, a
	// stalled network) does not make the call and stops with ErrLockLost,
	// because another worker may own the key already. Default Lease/10.
	LeaseMargin time.Duration

	// MaxPhaseRetries bounds how many times a phase is retried after a
	// serialization failure or deadlock before the request fails with
	// ErrRetriesExhausted. Default 3; negative disables retries.
	MaxPhaseRetries int

	// PhaseRetryBackoff is the wait before the first phase retry; it
	// doubles per retry, with jitter. Default 10ms.
	PhaseRetryBackoff time.Duration

	// FingerprintKeys, when set, keys request fingerprints with a server
	// secret: HMAC-SHA-256 under its Current key instead of SHA-256 (over
	// the payload the client sent; see Request.Payload). The fingerprint is
	// stored with every key; unkeyed, a fingerprint of a low-entropy input
	// (a card number) can be inverted by trying every value. Each key is at
	// least MinFingerprintKeyLength bytes.
	//
	// A key whose stored fingerprint is the request's under any key of the
	// keyring is that request: it is replayed or resumed, and keeps its
	// fingerprint. The request's fingerprint under each travels in the one
	// acquisition; each key beyond Current costs every request one HMAC more
	// over its canonical payload, which is made once. With AcceptUnkeyed,
	// keys fingerprinted before any key was set (plain SHA-256) match too.
	//
	// Switching changes every new fingerprint, so a retry of a key made
	// before the switch (in flight, or finished and replayed within its
	// retention) no longer matches its key: it is refused as a mismatch
	// (422 in idemhttp), and a half-done request cannot be resumed by its
	// client. To switch safely, set AcceptUnkeyed (or, to rotate a key, keep
	// the old one in Keys) together with the new Current, and keep it until
	// every key made before is gone: the longest of Retention and
	// UnfinishedRetention after the switch.
	FingerprintKeys *idemtype.Keyring

	// Flows registers flows by name, so keys can be completed and
	// reconciled by the maintenance services and the CLI, which have only
	// the stored key to go on. Execute works with unregistered flows too.
	Flows []AnyFlow

	// Maintenance configures the services Runner.Start runs in the
	// background: the reaper, the completer and reconcile runs (see
	// [Maintainer]). Default nil: every service with its defaults.
	Maintenance *MaintainerConfig

	// Logger receives the runner's structured logs. Default slog.Default().
	Logger *slog.Logger

	// LogKeys adds the scope and the key to the log records about a key.
	// Off by default: a scope is usually a tenant or user identifier, and
	// records name the key by its row id (key_id) instead, which an
	// operator can look up (`idem keys show --id ID`) without the logs
	// carrying tenants' identifiers; the maintenance passes' lines then
	// keep the key out of the error text they log too.
	LogKeys bool

	// RedactError rewrites an error's text before the runner persists or
	// exports it. Error text (a phase's own error, what a panic said, a
	// reconcile hook's reason, the store's errors) is stored with the key
	// as last_error (at most 4000 characters, kept until the key is
	// deleted), written to the logs, and handed to the Observer in events
	// and to a Tracer when it ends a span (idemotel records it as the
	// span's exception.message). Phases that put input in their errors
	// (a card number in a provider's decline message) leak it there: set
	// RedactError to scrub or replace such text. Errors observers and
	// tracers receive carry its text and still wrap the original, so
	// errors.Is works. The error Execute returns to its caller is not
	// rewritten. Default: the text as it is.
	RedactError func(err error) string

	// Observer receives counts and durations (see [Event]). Default none.
	Observer Observer

	// Test holds knobs for tests; leave it zero in production.
	Test TestConfig
}

// TestConfig holds test-only knobs. They are per runner, so tests using them
// stay safe under t.Parallel.
type TestConfig struct {
	// Now replaces the database clock for leases and expiry, so a test can
	// expire a lease without waiting. Nil uses the database's now().
	Now func() time.Time

	// hook is the test hook (internal/hooks), which idemtest sets.
	hook hooks.Func
}

func init() {
	hooks.Set = func(tc any, fn hooks.Func) { tc.(*TestConfig).hook = fn }
	hooks.Get = func(tc any) hooks.Func { return tc.(*TestConfig).hook }
	hooks.CurrentName = func(flow any, name string) (string, bool) {
		return flow.(interface {
			currentName(string) (string, bool)
		}).currentName(name)
	}
}

// Defaults of [Config]'s fields.
const (
	LeaseDefault               = 90 * time.Second
	MaxRetryAfterDefault       = 2 * time.Second
	MaxWaitersDefault          = 1000
	RetentionDefault           = 24 * time.Hour
	UnfinishedRetentionDefault = 7 * 24 * time.Hour
	IsolationDefault           = pgx.ReadCommitted
	MaxPhaseRetriesDefault     = 3
	PhaseRetryBackoffDefault   = 10 * time.Millisecond
	StatementTimeoutDefault    = 5 * time.Second
)

// WithDefaults returns a copy of c with every zero field set to its default.
func (c *Config) WithDefaults() *Config {
	out := &Config{}
	if c != nil {
		*out = *c
	}
	out.Lease = cmp.Or(out.Lease, LeaseDefault)
	out.HeartbeatInterval = cmp.Or(out.HeartbeatInterval, out.Lease/3)
	out.MaxRetryAfter = cmp.Or(out.MaxRetryAfter, MaxRetryAfterDefault)
	out.MaxWaiters = cmp.Or(out.MaxWaiters, MaxWaitersDefault)
	out.Retention = cmp.Or(out.Retention, RetentionDefault)
	out.UnfinishedRetention = cmp.Or(out.UnfinishedRetention, UnfinishedRetentionDefault)
	out.Isolation = cmp.Or(out.Isolation, IsolationDefault)
	out.MaxPhaseRetries = cmp.Or(out.MaxPhaseRetries, MaxPhaseRetriesDefault)
	out.PhaseRetryBackoff = cmp.Or(out.PhaseRetryBackoff, PhaseRetryBackoffDefault)
	out.StatementTimeout = cmp.Or(out.StatementTimeout, StatementTimeoutDefault)
	out.PhaseStatementTimeout = cmp.Or(out.PhaseStatementTimeout, out.StatementTimeout)
	out.LeaseMargin = cmp.Or(out.LeaseMargin, out.Lease/10)
	out.Logger = cmp.Or(out.Logger, slog.Default())
	out.Flows = append([]AnyFlow(nil), out.Flows...)
	return out
}

func (c *Config) validate() error {
	var errs []error
	if c.Lease < time.Second {
		errs = append(errs, fmt.Errorf("Lease %s is under 1s", c.Lease))
	}
	if c.HeartbeatInterval <= 0 || c.HeartbeatInterval >= c.Lease {
		errs = append(errs, fmt.Errorf("HeartbeatInterval %s must be positive and shorter than Lease %s", c.HeartbeatInterval, c.Lease))
	}
	if c.MaxRetryAfter < time.Second {
		errs = append(errs, fmt.Errorf("MaxRetryAfter %s is under 1s", c.MaxRetryAfter))
	}
	if c.Retention < 0 {
		errs = append(errs, fmt.Errorf("Retention %s is negative", c.Retention))
	}
	if c.UnfinishedRetention > 0 && c.UnfinishedRetention < c.Lease {
		errs = append(errs, fmt.Errorf("UnfinishedRetention %s is shorter than Lease %s", c.UnfinishedRetention, c.Lease))
	}
	switch c.Isolation {
	case pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable:
	default:
		errs = append(errs, fmt.Errorf("Isolation %q is not read committed, repeatable read or serializable", c.Isolation))
	}
	if c.StatementTimeout < 0 || c.PhaseStatementTimeout < 0 {
		errs = append(errs, fmt.Errorf("StatementTimeout %s and PhaseStatementTimeout %s must not be negative", c.StatementTimeout, c.PhaseStatementTimeout))
	}
	if c.LeaseMargin < 0 || c.LeaseMargin >= c.Lease-c.HeartbeatInterval {
		errs = append(errs, fmt.Errorf("LeaseMargin %s must be positive and leave room for a heartbeat (Lease %s minus HeartbeatInterval %s)", c.LeaseMargin, c.Lease, c.HeartbeatInterval))
	}
	if c.FingerprintKeys != nil {
		if err := c.FingerprintKeys.Check(MinFingerprintKeyLength, 0); err != nil {
			errs = append(errs, fmt.Errorf("FingerprintKeys: %w", err))
		}
	}
	if c.PhaseRetryBackoff < 0 {
		errs = append(errs, fmt.Errorf("PhaseRetryBackoff %s is negative", c.PhaseRetryBackoff))
	}
	seen := map[string]bool{}
	for _, f := range c.Flows {
		if f == nil {
			errs = append(errs, errors.New("Flows holds a nil flow"))
			continue
		}
		if seen[f.Name()] {
			errs = append(errs, fmt.Errorf("Flows holds two flows named %q", f.Name()))
		}
		seen[f.Name()] = true
	}
	if len(errs) > 0 {
		return fmt.Errorf("idem: invalid config: %w", errors.Join(errs...))
	}
	return nil
}
