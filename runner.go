package idem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/go-idem/idem/idemdriver"
	"github.com/jackc/pgx/v5"
)

// Runner runs flows: acquire the key, decide, resume at the phase after the
// recovery point, and run each phase in its own fenced transaction until one
// responds. A Runner is safe for concurrent use; make one per process.
//
// A request's path through the files of this package: [Runner.Execute]
// (runner.go) acquires the key and decides; a held key is driven phase by
// phase (drive, here), each phase-like body running in its transaction through
// runBody (body.go) with its lease kept alive and fenced (lock.go); the phase
// reaches the store only through its [Tx] and the [Attempt] handle
// (attempt.go).
type Runner struct {
	store  idemdriver.Store
	config *Config
	flows  map[string]AnyFlow
	log    *slog.Logger
	// waiting counts the requests waiting for a key in flight now
	// (Config.MaxWaiters).
	waiting atomic.Int64
}

// NewRunner returns a runner on store. A nil config means all defaults.
func NewRunner(store idemdriver.Store, config *Config) (*Runner, error) {
	if store == nil {
		return nil, errors.New("idem: NewRunner needs a store")
	}
	cfg := config.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Runner{store: store, config: cfg, flows: map[string]AnyFlow{}, log: cfg.Logger}
	for _, f := range cfg.Flows {
		r.flows[f.Name()] = f
	}
	r.warnUnkeyedFingerprints()
	return r, nil
}

// Config returns the runner's configuration with defaults applied. Treat it
// as read-only.
func (r *Runner) Config() *Config { return r.config }

// Store returns the runner's store.
func (r *Runner) Store() idemdriver.Store { return r.store }

// Flow returns the registered flow with the given name.
func (r *Runner) Flow(name string) (AnyFlow, bool) {
	f, ok := r.flows[name]
	return f, ok
}

// Request is one attempt of a client request, as the runner sees it.
type Request struct {
	// Scope is the tenant or user the key belongs to, derived from
	// authentication, never from the body: the same key in two scopes is two
	// independent requests. 1-255 characters.
	Scope string
	// Key is the client's idempotency key: 1-255 printable ASCII characters.
	Key string
	// Method and Path name the endpoint (Path is its route, such as a
	// ServeMux pattern, or the request path). Like the flow and the params,
	// they are bound to the key: the same key sent with another method or
	// path is a mismatch (ErrMismatch), and an unfinished key is never taken
	// over from another endpoint. Method defaults to POST.
	Method string
	Path   string
	// Params is the flow's input: a value of its In type (or a pointer to
	// one), or JSON that decodes into it.
	Params any

	// Payload is what the client sent, as it sent it, when Params was made
	// from it (an HTTP body, before it was decoded). The key's fingerprint
	// is taken over it rather than over Params, so a retry of the same
	// bytes matches its first attempt whatever a deploy changed in the
	// input type in between (a field added, a tag renamed, another value
	// filled in by the server); other bytes that mean the same JSON
	// (internal/canonical) match too. Nil takes the JSON that Params
	// is, when it is JSON, and otherwise the JSON encoding of the input.
	Payload []byte
	// PayloadBinary says Payload is not JSON but bytes compared as they
	// are (idemgrpc: the deterministic wire encoding of the message).
	PayloadBinary bool
	// Target is what else of the request the input was made from that the
	// client chose, bound to the key with the payload: the HTTP request
	// target (escaped path and query), which Path (a route pattern) leaves
	// out; the full method name for gRPC. A retry with another target is a
	// mismatch. It is hashed, never stored; it must not contain NUL.
	// Default none.
	Target string

	// RetryOnly makes the request a retry of a key that exists with this
	// very payload (Payload and Target), when the payload no longer makes
	// an input (a deploy made the decoding stricter, or validation
	// refuses what it accepted): it never creates a key, and Params is
	// ignored. A finished key is replayed; an unfinished one is resumed
	// from the input stored with it, decoded as the completer decodes it
	// (ErrUndecodableParams when it cannot be; ErrNoRedrive for a flow with
	// FlowConfig.NoRedrive). No key, or a key made by another payload, is
	// ErrNotFound or ErrMismatch, and the caller answers the payload's own
	// problem. Only keys fingerprinted over their payload (this release on)
	// match. idemhttp sets it for a body it cannot decode or validate.
	RetryOnly bool

	// Wait is how long the request waits, when another attempt holds its
	// key, for that attempt to end, instead of returning ErrInProgress at
	// once: it is then acquired again, as a retry arriving at that moment
	// would be, and gets the stored response (OutcomeReplayed), the
	// ErrNeedsReconcile of a key parked for reconciliation, or the key
	// itself, taken over and resumed, when the attempt failed and released
	// it or its holder died and its lease ran out. ErrInProgress when Wait
	// (or ctx) ends first. A waiting request holds no database connection:
	// the store watches the key for every waiter of the process at once
	// (idemdriver.Store.WatchKey: one check per tick, woken by a
	// notification where they work). Beyond Config.MaxWaiters waiting
	// requests, one is answered ErrInProgress at once, without waiting.
	// Outcome.Waited says how long it waited. Each acquisition
	// reports its event to the Observer (EventInProgress for each that
	// finds the key still held). When Wait passes, the key is acquired once
	// more before ErrInProgress is returned, so that an attempt that ended
	// without waking the waiter is still found. Zero (the default) does
	// not wait.
	Wait time.Duration

	// WaitContext, when set, also ends the waiting (Wait): when it is done,
	// the request stops waiting and returns ErrInProgress at once, without
	// acquiring the key again. It ends only the waiting: a request that
	// took the key over runs its flow under Execute's context. The
	// adapters set it to the request's own context, so that a client that
	// goes away does not keep a waiter.
	WaitContext context.Context
}

func (q *Request) normalise() error {
	if q.Method == "" {
		q.Method = "POST"
	}
	for _, f := range [...]struct{ name, v string }{{"scope", q.Scope}, {"method", q.Method}, {"path", q.Path}} {
		if !utf8.ValidString(f.v) || strings.IndexByte(f.v, 0) >= 0 {
			return fmt.Errorf("%w: %s must be UTF-8 without NUL characters", ErrInvalidRequest, f.name)
		}
	}
	switch {
	case q.Scope == "" || len(q.Scope) > 255:
		return fmt.Errorf("%w: scope must be 1-255 bytes", ErrInvalidRequest)
	case !ValidKey(q.Key):
		return fmt.Errorf("%w: key must be 1-255 printable ASCII characters", ErrInvalidRequest)
	case len(q.Method) > 16:
		return fmt.Errorf("%w: method longer than 16 bytes", ErrInvalidRequest)
	case len(q.Path) > 2048:
		return fmt.Errorf("%w: path longer than 2048 bytes", ErrInvalidRequest)
	case strings.IndexByte(q.Target, 0) >= 0:
		return fmt.Errorf("%w: target must not contain NUL characters", ErrInvalidRequest)
	}
	return nil
}

// ValidKey reports whether key is an acceptable idempotency key: 1-255
// printable ASCII characters (0x20-0x7E).
func ValidKey(key string) bool {
	if len(key) == 0 || len(key) > 255 {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return false
		}
	}
	return true
}

// Execute runs flow for req and returns the outcome. The error is nil exactly
// for OutcomeExecuted and OutcomeReplayed (a stored decline is still an
// executed outcome); otherwise Outcome.Kind is derived from it (see
// [OutcomeKind]).
func (r *Runner) Execute(ctx context.Context, flow AnyFlow, req Request) (*Outcome, error) {
	return r.executeWith(ctx, flow, req, nil)
}

// executeWith is Execute; stored, when set, is the input as stored with the
// key (the completer's, see storedInput), used instead of req.Params: it
// resumes an existing key and never creates one.
func (r *Runner) executeWith(ctx context.Context, flow AnyFlow, req Request, stored *prepared) (*Outcome, error) {
	started := time.Now()
	ctx, end := r.startRequest(ctx, flow.Name(), req.Scope)
	out, err := r.execute(ctx, flow, req, stored)
	if req.Wait > 0 && errors.Is(err, ErrInProgress) && out.Record != nil && r.enterWait(ctx, req) {
		out, err = r.waitAndExecute(ctx, flow, req, stored, out, err, started)
		r.waiting.Add(-1)
	}
	err = callerGone(ctx, err)
	out.settle(err)
	end(out, err)
	if out.Kind == OutcomeExecuted {
		r.emit(ctx, Event{Kind: EventFinished, Flow: flow.Name(), Scope: req.Scope, Key: req.Key, Duration: time.Since(started)})
	}
	return out, err
}

// execute acquires req's key, decides, and drives a key it holds. A new key
// commits on its own before its first phase runs: from then on it is there
// for a duplicate (in progress), another body (mismatch), operators and the
// completer, whatever the phase does.
func (r *Runner) execute(ctx context.Context, flow AnyFlow, req Request, stored *prepared) (*Outcome, error) {
	if err := req.normalise(); err != nil {
		return &Outcome{}, err
	}
	p := stored
	if p == nil && req.RetryOnly {
		var err error
		if p, err = r.retryInput(flow, &req); err != nil {
			return &Outcome{}, err
		}
	} else if p == nil {
		var err error
		if p, err = flow.prepare(&req, r.config.fingerprintKeys()); err != nil {
			return &Outcome{}, err
		}
	}
	sent := r.localNow()
	acq, err := r.acquire(ctx, flow, req, p, r.config.Admit != nil || p.fromKey)
	if err == nil && acq.Record == nil && stored != nil {
		return &Outcome{}, fmt.Errorf("%w: key %q is gone (reaped or abandoned); the completer does not create keys", ErrNotFound, req.Key)
	}
	if err == nil && acq.Record == nil && p.fromKey {
		return &Outcome{}, fmt.Errorf("%w: no key %q to retry; a retry-only request does not create one", ErrNotFound, req.Key)
	}
	if err == nil && acq.Record == nil {
		// There is no live key: this request would create one, which
		// Config.Admit may refuse.
		if out, err := r.admit(ctx, flow, req); err != nil {
			return out, err
		}
		sent = r.localNow()
		acq, err = r.acquire(ctx, flow, req, p, false)
	}
	ev := Event{Flow: flow.Name(), Scope: req.Scope, Key: req.Key}
	if err != nil {
		err = r.storeError(ctx, err)
		if ctx.Err() != nil {
			// The caller went away; the store did not fail. Execute labels
			// it OutcomeCanceled.
			return &Outcome{}, fmt.Errorf("acquire: %w", err)
		}
		ev.Kind, ev.Err = EventStoreError, err
		r.emit(ctx, ev)
		r.log.ErrorContext(ctx, "idem: acquire failed; nothing executed", r.logAttrs(req.Scope, req.Key, 0, "flow", flow.Name(), "err", r.redact(err))...)
		return &Outcome{}, fmt.Errorf("acquire: %w", err)
	}
	rec := acq.Record
	switch acq.Acquired {
	case idemdriver.AcquiredCreated:
		ev.Kind = EventCreated
		r.emit(ctx, ev)
		return r.resume(ctx, r.hold(flow, rec, p.input, false, sent))
	case idemdriver.AcquiredTakenOver:
		ev.Kind = EventTakeover
		r.emit(ctx, ev)
		r.log.InfoContext(ctx, "idem: resuming an unfinished key", r.logAttrs(req.Scope, req.Key, rec.ID, "flow", flow.Name(),
			"recovery_point", rec.RecoveryPoint, "attempts", rec.Attempts, "last_error", rec.LastError)...)
		h := r.hold(flow, rec, p.input, true, sent)
		if p.fromKey {
			if req.RetryOnly && !flow.redrives() {
				// Not the completer (which never takes such a flow's
				// keys): a retry whose input cannot drive the phases.
				return r.fail(ctx, h, fmt.Errorf("%w: flow %q cannot resume key %q from the input stored with it, and this retry's payload no longer makes one", ErrNoRedrive, flow.Name(), req.Key))
			}
			params := p.params
			if params == nil {
				params = rec.Params
			}
			if h.input, err = flow.decodeStored(params); err != nil {
				return r.undecodable(ctx, h, err)
			}
		}
		return r.resume(ctx, h)
	}

	// Nothing was locked: report what is there. The mismatch check comes
	// first, so a different request learns nothing about this key's state.
	if rec.Flow != flow.Name() || rec.Method != req.Method || rec.Path != req.Path || (!rec.SameRequest(p.fingerprints) && !rec.FromV01()) {
		ev.Kind = EventMismatch
		r.emit(ctx, ev)
		return &Outcome{}, fmt.Errorf("%w: key %q was first used by flow %q at %s %s, with its own params", ErrMismatch, req.Key, rec.Flow, rec.Method, rec.Path)
	}
	switch {
	case rec.Status == StatusFinished && rec.RecoveryPoint == RecoveryPointAbandoned:
		ev.Kind = EventReplayed
		r.emit(ctx, ev)
		return &Outcome{Record: rec}, fmt.Errorf("%w: key %q", ErrRequestAbandoned, req.Key)
	case rec.Status == StatusFinished:
		ev.Kind = EventReplayed
		r.emit(ctx, ev)
		return &Outcome{replayed: true, Response: rec.Response(), Record: rec}, nil
	case rec.Status == StatusNeedsReconcile:
		ev.Kind = EventNeedsReconcile
		r.emit(ctx, ev)
		return &Outcome{Record: rec}, fmt.Errorf("%w: key %q", ErrNeedsReconcile, req.Key)
	}
	ev.Kind = EventInProgress
	r.emit(ctx, ev)
	return &Outcome{Record: rec, RetryAfter: retryAfter(rec, acq.DBNow, r.config.MaxRetryAfter)},
		fmt.Errorf("%w: key %q", ErrInProgress, req.Key)
}

// waitAndExecute waits, until req.Wait after started, for the attempt that
// holds the key out reports in progress to end, and executes req again
// each time it may have, and once more when the wait passes (a wake-up
// that never came). req.WaitContext (and ctx) ending stops the waiting at
// once. Outcome.Waited is the time spent waiting.
func (r *Runner) waitAndExecute(ctx context.Context, flow AnyFlow, req Request, stored *prepared, out *Outcome, err error, started time.Time) (*Outcome, error) {
	until := started.Add(req.Wait)
	waitCtx := ctx
	if req.WaitContext != nil {
		var cancel context.CancelFunc
		waitCtx, cancel = context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(req.WaitContext, cancel)()
	}
	var waited time.Duration
	lapsed := false
	for errors.Is(err, ErrInProgress) && out.Record != nil {
		left := time.Until(until)
		if left <= 0 || waitCtx.Err() != nil {
			break
		}
		woken, stop := r.store.WatchKey(waitCtx, idemdriver.Watch{
			Ref:    idemdriver.LockRef{ID: out.Record.ID, Fence: out.Record.Fence, Scope: out.Record.Scope},
			Lapsed: lapsed,
		})
		began := time.Now()
		timer := time.NewTimer(left)
		wake := false
		select {
		case <-woken:
			wake = true
		case <-timer.C:
			// The wait's end: the key is acquired once more, as a retry
			// arriving now would acquire it.
			wake = true
		case <-waitCtx.Done():
		}
		timer.Stop()
		stop()
		waited += time.Since(began)
		if !wake {
			break
		}
		before := out.Record
		out, err = r.execute(ctx, flow, req, stored)
		// Woken, but the same attempt holds the key with the same lease:
		// it ran out by the store's clock and not by the runner's (a test
		// clock).
		lapsed = out.Record != nil && out.Record.ID == before.ID && out.Record.Fence == before.Fence &&
			out.Record.LeaseExpiresAt != nil && before.LeaseExpiresAt != nil && out.Record.LeaseExpiresAt.Equal(*before.LeaseExpiresAt)
	}
	out.Waited = waited
	return out, err
}

// enterWait counts req in among the runner's waiters, or reports false when
// Config.MaxWaiters of them wait already: req is then answered in progress
// at once.
func (r *Runner) enterWait(ctx context.Context, req Request) bool {
	n := r.waiting.Add(1)
	if max := int64(r.config.MaxWaiters); max > 0 && n > max {
		r.waiting.Add(-1)
		r.log.DebugContext(ctx, "idem: too many requests waiting; answered in progress at once", r.logAttrs(req.Scope, req.Key, 0, "max_waiters", max)...)
		return false
	}
	return true
}

// retryInput is what a RetryOnly request brings: the fingerprint of its
// payload, and the key's stored input, decoded once the key is held.
func (r *Runner) retryInput(flow AnyFlow, req *Request) (*prepared, error) {
	if req.Payload == nil {
		return nil, fmt.Errorf("%w: a retry-only request needs its Payload", ErrInvalidRequest)
	}
	fps, err := fingerprints(r.config.fingerprintKeys(), flow.Name(), req.Target, req.Payload, req.PayloadBinary)
	if err != nil {
		return nil, err
	}
	return &prepared{fingerprints: fps, fromKey: true}, nil
}

// acquire is the acquisition of req's key, bounded by StatementTimeout.
// noCreate asks for an existing key only (see idemdriver.AcquireParams).
func (r *Runner) acquire(ctx context.Context, flow AnyFlow, req Request, p *prepared, noCreate bool) (*idemdriver.AcquireResult, error) {
	actx, cancel := r.storeContext(ctx)
	defer cancel()
	return r.store.Acquire(actx, idemdriver.AcquireParams{
		Scope: req.Scope, Key: req.Key, Flow: flow.Name(), Method: req.Method, Path: req.Path,
		Fingerprints: p.fingerprints, Params: p.params, Lease: r.config.Lease, NoCreate: noCreate, Now: r.now(),
	})
}

// phaseOptions are the options of a phase transaction at iso (empty: the
// runner's default).
func (r *Runner) phaseOptions(iso pgx.TxIsoLevel) idemdriver.PhaseOptions {
	return idemdriver.PhaseOptions{Isolation: cmp.Or(iso, r.config.Isolation), StatementTimeout: r.config.PhaseStatementTimeout}
}

// admit asks Config.Admit whether req may create a new key. Nothing has been
// written when it refuses.
func (r *Runner) admit(ctx context.Context, flow AnyFlow, req Request) (*Outcome, error) {
	err := r.config.Admit(ctx, req.Scope, flow.Name())
	if err == nil {
		return nil, nil
	}
	if !errors.Is(err, ErrTooManyKeys) {
		return &Outcome{}, fmt.Errorf("admit: %w", err)
	}
	wait := time.Second
	if tm, ok := errors.AsType[*TooManyKeysError](err); ok {
		wait = max(tm.RetryAfter, time.Second)
	}
	r.emit(ctx, Event{Kind: EventTooManyKeys, Flow: flow.Name(), Scope: req.Scope, Key: req.Key, Err: err})
	return &Outcome{RetryAfter: wait}, fmt.Errorf("admit: %w", err)
}

// retryAfter is the time left on the holder's lease, rounded up to whole
// seconds, at least one and at most limit. A row that looked takeable in
// the statement's snapshot but was not taken was just locked by someone
// else: one second. It is the one place a retry delay is computed; adapters
// only format it.
func retryAfter(rec *KeyRecord, now time.Time, limit time.Duration) time.Duration {
	if rec.LeaseExpiresAt == nil || !rec.LeaseExpiresAt.After(now) {
		return time.Second
	}
	left := min(rec.LeaseExpiresAt.Sub(now), limit)
	secs := (left + time.Second - 1) / time.Second
	return max(secs, 1) * time.Second
}

// resume drives a key this call holds the lock on from its recovery point.
func (r *Runner) resume(ctx context.Context, h *held) (*Outcome, error) {
	ctx, release := r.holdLease(ctx, h)
	defer release()

	if h.rec.ForeignMark != "" {
		// A not-idempotent call may have happened without its phase
		// committing: never re-run it blindly.
		return r.toNeedsReconcile(ctx, h, fmt.Sprintf("phase %q may have made its foreign call without committing", h.rec.ForeignMark))
	}
	from, err := h.nextPhase()
	if err != nil {
		return r.fail(ctx, h, err)
	}
	return r.drive(ctx, h, from)
}

// drive runs phases from index from until one responds: each transaction
// from its first phase through the phases that join it.
func (r *Runner) drive(ctx context.Context, h *held, from int) (*Outcome, error) {
	for i := from; i < len(h.flow.PhaseNames()); i = h.phase + 1 {
		h.enterPhase(i)
		res, err := r.runBody(ctx, h, r.phaseBody(h))
		if err != nil {
			return r.fail(ctx, h, err)
		}
		if res.Responds() {
			return h.outcome(res.response), nil
		}
	}
	// Unreachable: the last phase is made to respond before it commits.
	return r.fail(ctx, h, fmt.Errorf("%w: flow %q ran out of phases", ErrPhaseFailed, h.flow.Name()))
}

// phaseBody is the body of the held key's current transaction: the Do of
// its first phase and of each phase that joins it (Phase.JoinPrevious), in
// order, until one responds or the next does not join; then the commit the
// last one's result asks for. Each joined phase starts and ends at the test
// hooks as a phase of its own, so the crash kit can stop between them.
func (r *Runner) phaseBody(h *held) body {
	return func(ctx context.Context, tx Tx) (Result, *idemdriver.CommitParams, error) {
		for {
			res, err := h.flow.callDo(ctx, tx, h)
			if err != nil {
				return res, nil, err
			}
			if res.err != nil {
				return res, nil, fmt.Errorf("phase %q built its response: %w", h.phaseName(), res.err)
			}
			if !res.Responds() && h.phase == len(h.flow.PhaseNames())-1 {
				return res, nil, fmt.Errorf("phase %q is the last of flow %q and must respond, not advance", h.phaseName(), h.flow.Name())
			}
			if res.Responds() {
				res.response = storableResponse(res.response)
				return res, r.commitFor(h, res), nil
			}
			if !h.flow.joinsPrevious(h.phase + 1) {
				return res, r.commitFor(h, res), nil
			}
			// The phase's work is done and its commit is the next phase's.
			if err := r.hook(ctx, h, HookBeforeCommit); err != nil {
				return res, nil, err
			}
			h.phase++
			if err := r.hook(ctx, h, HookPhaseStart); err != nil {
				return res, nil, err
			}
		}
	}
}

// commitFor is what a phase (or a reconcile hook speaking for it) that ended
// with res records on the key.
func (r *Runner) commitFor(h *held, res Result) *idemdriver.CommitParams {
	cp := &idemdriver.CommitParams{
		Ref:             h.ref,
		Flow:            h.rec.Flow,
		Generation:      h.rec.Generation,
		RecoveryPoint:   h.phaseName(),
		Status:          StatusRunning,
		CheckpointPatch: h.patch,
		Retention:       r.config.Retention,
		Now:             r.now(),
	}
	if h.flow != nil { // nil: an operator resolves a key of a flow this runner does not know
		cp.Retention = h.flow.retentionOr(cp.Retention)
	}
	if res.Responds() {
		cp.RecoveryPoint, cp.Status, cp.Response = RecoveryPointFinished, StatusFinished, res.response
	}
	return cp
}

// fail ends a held request that could not finish.
func (r *Runner) fail(ctx context.Context, h *held, err error) (*Outcome, error) {
	ev := h.event("", err)
	switch {
	case h.crashed:
		// A dead process releases nothing: leave the key for the lease to
		// expire, exactly as a real crash would.
		return h.outcome(nil), err
	case errors.Is(err, ErrLockLost):
		ev.Kind = EventLockLost
		r.emit(ctx, ev)
		r.log.WarnContext(ctx, "idem: lock lost; another worker owns the key", h.logAttrs("flow", h.flow.Name(), "phase", h.phaseName(), "fence", h.ref.Fence)...)
		return h.outcome(nil), err
	case h.foreignMarked || h.reconciling:
		return r.toNeedsReconcile(ctx, h, r.errorText(err))
	}
	// A caller that went away interrupted the phase; it did not fail
	// (Execute labels the outcome OutcomeCanceled).
	gone := ctx.Err() != nil && !errors.Is(context.Cause(ctx), ErrLockLost)
	if !gone {
		ev.Kind = EventPhaseFailed
		r.emit(ctx, ev)
	}
	h.lettingGo.Store(true)
	// Release with a context detached from the request's: a client that
	// went away must not leave the key locked for a whole lease.
	rctx, cancel := r.storeContext(context.WithoutCancel(ctx))
	defer cancel()
	switch rerr := r.store.Release(rctx, h.ref, r.errorText(err)); {
	case errors.Is(rerr, ErrLockLost):
		// Another worker took the key over while this one failed: it owns
		// the request now, whatever this attempt's error was.
		r.emit(ctx, h.event(EventLockLost, rerr))
		return h.outcome(nil), fmt.Errorf("%w (after: %s)", rerr, err)
	case rerr != nil:
		r.emit(ctx, h.event(EventStoreError, rerr))
		r.log.ErrorContext(ctx, "idem: could not release key; it unlocks when its lease expires", h.logAttrs("err", r.redact(rerr))...)
	}
	if gone {
		r.log.InfoContext(ctx, "idem: the caller went away; phase rolled back and key released for retry", h.logAttrs("flow", h.flow.Name(), "phase", h.phaseName(), "err", r.redact(err))...)
		return h.outcome(nil), err
	}
	r.log.WarnContext(ctx, "idem: phase failed; key released for retry", h.logAttrs("flow", h.flow.Name(), "phase", h.phaseName(), "err", r.redact(err))...)
	return h.outcome(nil), err
}

// undecodable releases a key taken over to be re-driven from its stored
// params, which do not decode into its flow's input (err wraps
// ErrUndecodableParams): the release records err as the key's last error,
// and the takeover counted an attempt, so the key is reported (logs, events,
// `keys list`) and turns stale after CompleteConfig.MaxAttempts instead of
// being picked up silently on every pass. A client's retry brings its own
// input and resumes it.
func (r *Runner) undecodable(ctx context.Context, h *held, err error) (*Outcome, error) {
	err = fmt.Errorf("key %q of flow %q: %w", h.rec.Key, h.flow.Name(), err)
	h.lettingGo.Store(true)
	rctx, cancel := r.storeContext(context.WithoutCancel(ctx))
	defer cancel()
	if rerr := r.store.Release(rctx, h.ref, r.errorText(err)); rerr != nil {
		rerr = r.storeError(ctx, rerr)
		r.emit(ctx, h.event(EventStoreError, rerr))
		r.log.ErrorContext(ctx, "idem: could not release key; it unlocks when its lease expires", h.logAttrs("err", r.redact(rerr))...)
	}
	r.emit(ctx, h.event(EventPhaseFailed, err))
	r.log.ErrorContext(ctx, "idem: the params stored with the key do not decode into its flow's input; key released for its client's retry or an operator",
		h.logAttrs("flow", h.flow.Name(), "recovery_point", h.rec.RecoveryPoint, "attempts", h.rec.Attempts, "err", r.redact(err))...)
	return h.outcome(nil), err
}

// toNeedsReconcile parks a held key whose not-idempotent call is in doubt.
// reason is stored and logged: pass error text through errorText.
func (r *Runner) toNeedsReconcile(ctx context.Context, h *held, reason string) (*Outcome, error) {
	h.lettingGo.Store(true)
	rctx, cancel := r.storeContext(context.WithoutCancel(ctx))
	defer cancel()
	if err := r.store.SetNeedsReconcile(rctx, h.ref, reason); err != nil {
		// Whatever happened, the mark stays on the row, so the next
		// acquisition lands here again: nothing is re-run blindly.
		err = r.storeError(ctx, err)
		r.emit(ctx, h.event(EventStoreError, err))
		return h.outcome(nil), err
	}
	h.rec.Status = StatusNeedsReconcile
	r.emit(ctx, h.event(EventNeedsReconcile, nil))
	r.log.WarnContext(ctx, "idem: key needs reconciliation", h.logAttrs("flow", h.rec.Flow, "reason", reason)...)
	return h.outcome(nil), fmt.Errorf("%w: key %q: %s", ErrNeedsReconcile, h.rec.Key, reason)
}

// storeContext bounds one of the runner's own round trips to the store by
// Config.StatementTimeout.
func (r *Runner) storeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.config.StatementTimeout)
}

// storeError classifies the error of a store call made under storeContext:
// a deadline the runner set is the store not answering in time, which is
// ErrStoreUnavailable; the caller's own cancellation stays a context error.
func (r *Runner) storeError(ctx context.Context, err error) error {
	if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, ErrStoreUnavailable) {
		return fmt.Errorf("%w: no answer within %s: %w", ErrStoreUnavailable, r.config.StatementTimeout, err)
	}
	return err
}

// localNow is this process's clock for lease arithmetic (self-fencing): the
// test clock when Config.Test.Now is set.
func (r *Runner) localNow() time.Time {
	if r.config.Test.Now != nil {
		return r.config.Test.Now()
	}
	return time.Now()
}

func (r *Runner) now() *time.Time {
	if r.config.Test.Now == nil {
		return nil
	}
	t := r.config.Test.Now()
	return &t
}

func (r *Runner) emit(ctx context.Context, e Event) {
	if r.config.Observer != nil {
		e.Err = r.redact(e.Err)
		r.config.Observer.Observe(ctx, e)
	}
}

func (r *Runner) startRequest(ctx context.Context, flow, scope string) (context.Context, func(*Outcome, error)) {
	if t, ok := r.config.Observer.(Tracer); ok {
		ctx, end := t.StartRequest(ctx, flow, scope)
		return ctx, func(out *Outcome, err error) { end(out, r.redact(err)) }
	}
	return ctx, func(*Outcome, error) {}
}

func (r *Runner) startPhase(ctx context.Context, flow, phase string, attempt int) (context.Context, func(error)) {
	if t, ok := r.config.Observer.(Tracer); ok {
		ctx, end := t.StartPhase(ctx, flow, phase, attempt)
		return ctx, func(err error) { end(r.redact(err)) }
	}
	return ctx, func(error) {}
}
