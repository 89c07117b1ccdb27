package idem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Runner runs flows: acquire the key, decide, resume at the phase after the
// recovery point, and run each phase in its own fenced transaction until one
// responds. A Runner is safe for concurrent use; make one per process.
type Runner struct {
	store  Store
	config *Config
	flows  map[string]AnyFlow
	log    *slog.Logger
}

// NewRunner returns a runner on store. A nil config means all defaults.
func NewRunner(store Store, config *Config) (*Runner, error) {
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
	return r, nil
}

// Config returns the runner's configuration with defaults applied. Treat it
// as read-only.
func (r *Runner) Config() *Config { return r.config }

// Store returns the runner's store.
func (r *Runner) Store() Store { return r.store }

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

// Execute runs flow for req and returns the outcome. The error is nil exactly for
// OutcomeExecuted and OutcomeReplayed (a stored decline is still an executed
// outcome); otherwise it wraps the sentinel matching Outcome.Kind.
func (r *Runner) Execute(ctx context.Context, flow AnyFlow, req Request) (*Outcome, error) {
	started := time.Now()
	ctx, end := r.startRequest(ctx, flow.Name(), req.Scope)
	out, err := r.run(ctx, flow, req)
	end(out, err)
	if out.Kind == OutcomeExecuted {
		r.emit(ctx, Event{Kind: EventFinished, Flow: flow.Name(), Scope: req.Scope, Key: req.Key, Duration: time.Since(started)})
	}
	return out, err
}

func (r *Runner) run(ctx context.Context, flow AnyFlow, req Request) (*Outcome, error) {
	if err := req.normalise(); err != nil {
		return &Outcome{Kind: OutcomeInvalid}, err
	}
	p, err := flow.prepare(req.Params)
	if err != nil {
		return &Outcome{Kind: OutcomeInvalid}, err
	}
	acq, err := r.store.Acquire(ctx, AcquireParams{
		Scope: req.Scope, Key: req.Key, Flow: flow.Name(), Method: req.Method, Path: req.Path,
		Fingerprint: p.fingerprint, Params: p.params, Lease: r.config.Lease, Now: r.now(),
	})
	ev := Event{Flow: flow.Name(), Scope: req.Scope, Key: req.Key}
	if err != nil {
		ev.Kind, ev.Err = EventStoreError, err
		r.emit(ctx, ev)
		r.log.ErrorContext(ctx, "idem: acquire failed; nothing executed", "flow", flow.Name(), "scope", req.Scope, "key", req.Key, "err", err)
		switch {
		case errors.Is(err, ErrStoreUnavailable):
			return &Outcome{Kind: OutcomeStoreUnavailable}, fmt.Errorf("acquire: %w", err)
		case errors.Is(err, ErrInvalidRequest):
			return &Outcome{Kind: OutcomeInvalid}, fmt.Errorf("acquire: %w", err)
		}
		return &Outcome{Kind: OutcomeFailed}, fmt.Errorf("%w: acquire: %w", ErrPhaseFailed, err)
	}
	rec := acq.Record
	switch acq.Acquired {
	case AcquiredCreated:
		ev.Kind = EventCreated
		r.emit(ctx, ev)
		return r.execute(ctx, flow, rec, p.input, false)
	case AcquiredTakenOver:
		ev.Kind = EventTakeover
		r.emit(ctx, ev)
		r.log.InfoContext(ctx, "idem: resuming an unfinished key", "flow", flow.Name(), "scope", req.Scope, "key", req.Key,
			"recovery_point", rec.RecoveryPoint, "attempts", rec.Attempts, "last_error", rec.LastError)
		return r.execute(ctx, flow, rec, p.input, true)
	}

	// Nothing was locked: report what is there. The mismatch check comes
	// first, so a different request learns nothing about this key's state.
	if rec.Flow != flow.Name() || rec.Method != req.Method || rec.Path != req.Path || !bytes.Equal(rec.Fingerprint, p.fingerprint) {
		ev.Kind = EventMismatch
		r.emit(ctx, ev)
		return &Outcome{Kind: OutcomeMismatch}, fmt.Errorf("%w: key %q was first used by flow %q at %s %s, with its own params", ErrMismatch, req.Key, rec.Flow, rec.Method, rec.Path)
	}
	switch rec.Status {
	case StatusFinished:
		ev.Kind = EventReplayed
		r.emit(ctx, ev)
		return &Outcome{Kind: OutcomeReplayed, Response: rec.Response(), Record: rec}, nil
	case StatusNeedsReconcile:
		ev.Kind = EventNeedsReconcile
		r.emit(ctx, ev)
		return &Outcome{Kind: OutcomeNeedsReconcile, Record: rec}, fmt.Errorf("%w: key %q", ErrNeedsReconcile, req.Key)
	}
	ev.Kind = EventInProgress
	r.emit(ctx, ev)
	return &Outcome{Kind: OutcomeInProgress, Record: rec, RetryAfter: retryAfter(rec, acq.DBNow, r.config.MaxRetryAfter)},
		fmt.Errorf("%w: key %q", ErrInProgress, req.Key)
}

// retryAfter is the time left on the holder's lease, rounded up to whole
// seconds, at least one and at most limit. A row that looked takeable in
// the statement's snapshot but was not taken was just locked by someone
// else: one second.
func retryAfter(rec *KeyRecord, now time.Time, limit time.Duration) time.Duration {
	if rec.LeaseExpiresAt == nil || !rec.LeaseExpiresAt.After(now) {
		return time.Second
	}
	left := min(rec.LeaseExpiresAt.Sub(now), limit)
	secs := (left + time.Second - 1) / time.Second
	return max(secs, 1) * time.Second
}

// execute drives a key this call holds the lock on.
func (r *Runner) execute(ctx context.Context, flow AnyFlow, rec *KeyRecord, input any, tookOver bool) (*Outcome, error) {
	st := &runState{runner: r, flow: flow, rec: rec, ref: LockRef{ID: rec.ID, Fence: rec.Fence}, input: input}
	ctx, release := r.holdLease(ctx, st)
	defer release()

	if rec.ForeignMark != "" {
		// A not-idempotent call may have happened without its phase
		// committing: never re-run it blindly.
		return r.toNeedsReconcile(ctx, st, fmt.Sprintf("phase %q may have made its foreign call without committing", rec.ForeignMark), tookOver)
	}
	from := 0
	if rec.RecoveryPoint != RecoveryPointStarted {
		i, ok := flow.phaseIndex(rec.RecoveryPoint)
		if !ok {
			err := fmt.Errorf("%w: key %q is at %q, which flow %q does not have", ErrUnknownRecoveryPoint, rec.Key, rec.RecoveryPoint, flow.Name())
			return r.fail(ctx, st, err, tookOver)
		}
		from = i + 1
	}
	return r.drive(ctx, st, from, tookOver)
}

// drive runs phases from index from until one responds.
func (r *Runner) drive(ctx context.Context, st *runState, from int, tookOver bool) (*Outcome, error) {
	for i := from; i < len(st.flow.PhaseNames()); i++ {
		res, err := r.runPhase(ctx, st, i)
		if err != nil {
			return r.fail(ctx, st, err, tookOver)
		}
		if res.Responds() {
			return &Outcome{Kind: OutcomeExecuted, Response: res.response, Record: st.rec.clone(), TookOver: tookOver}, nil
		}
	}
	// Unreachable: the last phase is made to respond before it commits.
	return r.fail(ctx, st, fmt.Errorf("%w: flow %q ran out of phases", ErrPhaseFailed, st.flow.Name()), tookOver)
}

// runPhase runs phase i, retrying serialization failures and deadlocks.
func (r *Runner) runPhase(ctx context.Context, st *runState, i int) (Result, error) {
	name, _, iso := st.flow.phaseMeta(i)
	if iso == "" {
		iso = r.config.Isolation
	}
	backoff := r.config.PhaseRetryBackoff
	for attempt := 1; ; attempt++ {
		st.beginAttempt(i, attempt)
		res, err := r.attemptPhase(ctx, st, iso)
		if err == nil || st.crashed || !errors.Is(err, ErrSerialization) {
			return res, err
		}
		if st.foreignMarked {
			// The not-idempotent call may have happened: re-running the
			// phase could repeat it. fail() sends the key to reconcile.
			return res, err
		}
		if attempt > r.config.MaxPhaseRetries {
			return res, fmt.Errorf("%w: phase %q failed %d times: %w", ErrRetriesExhausted, name, attempt, err)
		}
		r.emit(ctx, st.event(EventPhaseRetried, err))
		r.log.DebugContext(ctx, "idem: retrying phase", "flow", st.flow.Name(), "phase", name, "attempt", attempt, "err", err)
		wait := backoff/2 + rand.N(backoff/2+1)
		backoff *= 2
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return res, context.Cause(ctx)
		}
	}
}

// attemptPhase is one try of the current phase in its own transaction.
func (r *Runner) attemptPhase(ctx context.Context, st *runState, iso pgx.TxIsoLevel) (res Result, err error) {
	name := st.phaseName()
	ctx, end := r.startPhase(ctx, st.flow.Name(), name, st.attempt)
	defer func() { end(err) }()
	started := time.Now()

	tx, err := r.store.BeginPhase(ctx, iso)
	if err != nil {
		return res, r.classify(ctx, st, nil, err)
	}
	committed := false
	defer func() {
		if !committed {
			// A context detached from cancellation: the rollback must reach
			// the server even when the request's context is done.
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()

	if err := r.hook(ctx, st, HookPhaseStart); err != nil {
		return res, r.classify(ctx, st, tx, err)
	}
	res, err = r.callPhase(ctx, tx, st)
	if err == nil && res.err != nil {
		err = fmt.Errorf("phase %q built its response: %w", name, res.err)
	}
	if err == nil && !res.Responds() && st.phase == len(st.flow.PhaseNames())-1 {
		err = fmt.Errorf("phase %q is the last of flow %q and must respond, not advance", name, st.flow.Name())
	}
	if err == nil {
		err = r.hook(ctx, st, HookBeforeCommit)
	}
	if err != nil {
		return res, r.classify(ctx, st, tx, err)
	}

	cp := CommitParams{
		Ref:             st.ref,
		RecoveryPoint:   name,
		Status:          StatusRunning,
		CheckpointPatch: st.patch,
		Lease:           r.config.Lease,
		Retention:       st.flow.retentionOr(r.config.Retention),
		Now:             r.now(),
	}
	if res.Responds() {
		cp.RecoveryPoint, cp.Status, cp.Response = RecoveryPointFinished, StatusFinished, storableResponse(res.response)
		st.leaseEnded.Store(true)
	}
	if err := r.store.CommitPhase(ctx, tx, cp); err != nil {
		return res, r.classify(ctx, st, tx, err)
	}
	committed = true
	st.committed(cp)
	r.emit(ctx, Event{Kind: EventPhaseCommitted, Flow: st.flow.Name(), Scope: st.rec.Scope, Key: st.rec.Key, Phase: name, Attempt: st.attempt, Duration: time.Since(started)})
	if err := r.hook(ctx, st, HookAfterCommit); err != nil {
		if st.crashed {
			return res, err
		}
		// A lost acknowledgement: the phase committed, but this worker
		// cannot know it. It must not retry the phase; it reports the store
		// unavailable and lets go of the key, and the next attempt resumes
		// from what actually committed.
		return res, fmt.Errorf("%w: commit acknowledgement of phase %q lost: %w", ErrStoreUnavailable, name, err)
	}
	return res, nil
}

// callPhase runs the phase body, turning a panic into a *PanicError.
func (r *Runner) callPhase(ctx context.Context, tx pgx.Tx, st *runState) (res Result, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return st.flow.callDo(ctx, tx, st)
}

// classify turns a phase attempt's error into the error the runner acts on.
//
// tx is the phase's transaction, still open, or nil before it exists.
func (r *Runner) classify(ctx context.Context, st *runState, tx pgx.Tx, err error) error {
	switch {
	case st.crashed || errors.Is(err, ErrSimulatedCrash):
		st.crashed = true
		return ErrSimulatedCrash
	case errors.Is(context.Cause(ctx), ErrLockLost):
		// The heartbeat found the lease gone and cancelled the phase.
		return fmt.Errorf("%w: phase %q", ErrLockLost, st.phaseName())
	case errors.Is(err, ErrLockLost):
		return err
	}
	mapped := r.store.ClassifyPhaseError(tx, err)
	if errors.Is(mapped, ErrSerialization) || errors.Is(mapped, ErrStoreUnavailable) || errors.Is(mapped, ErrInvalidRequest) {
		return mapped
	}
	var pe *PanicError
	if errors.As(err, &pe) {
		return err
	}
	if errors.Is(err, ErrPhaseFailed) {
		return err
	}
	return fmt.Errorf("%w: phase %q: %w", ErrPhaseFailed, st.phaseName(), err)
}

// fail ends a held request that could not finish.
func (r *Runner) fail(ctx context.Context, st *runState, err error, tookOver bool) (*Outcome, error) {
	ev := st.event("", err)
	switch {
	case st.crashed:
		// A dead process releases nothing: leave the key for the lease to
		// expire, exactly as a real crash would.
		return &Outcome{Kind: OutcomeAbandoned, Record: st.rec.clone(), TookOver: tookOver}, err
	case errors.Is(err, ErrLockLost):
		ev.Kind = EventLockLost
		r.emit(ctx, ev)
		r.log.WarnContext(ctx, "idem: lock lost; another worker owns the key", "flow", st.flow.Name(), "key", st.rec.Key, "phase", st.phaseName(), "fence", st.ref.Fence)
		return &Outcome{Kind: OutcomeLockLost, Record: st.rec.clone(), TookOver: tookOver}, err
	case st.foreignMarked:
		return r.toNeedsReconcile(ctx, st, err.Error(), tookOver)
	}
	ev.Kind = EventPhaseFailed
	r.emit(ctx, ev)
	st.leaseEnded.Store(true)
	// Release with a context detached from the request's: a client that
	// went away must not leave the key locked for a whole lease.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	switch rerr := r.store.Release(rctx, st.ref, err.Error()); {
	case errors.Is(rerr, ErrLockLost):
		// Another worker took the key over while this one failed: it owns
		// the request now, whatever this attempt's error was.
		r.emit(ctx, st.event(EventLockLost, rerr))
		return &Outcome{Kind: OutcomeLockLost, Record: st.rec.clone(), TookOver: tookOver}, fmt.Errorf("%w (after: %w)", rerr, err)
	case rerr != nil:
		r.emit(ctx, st.event(EventStoreError, rerr))
		r.log.ErrorContext(ctx, "idem: could not release key; it unlocks when its lease expires", "key", st.rec.Key, "err", rerr)
	}
	r.log.WarnContext(ctx, "idem: phase failed; key released for retry", "flow", st.flow.Name(), "key", st.rec.Key, "phase", st.phaseName(), "err", err)
	kind := OutcomeFailed
	if errors.Is(err, ErrStoreUnavailable) {
		kind = OutcomeStoreUnavailable
	}
	return &Outcome{Kind: kind, Record: st.rec.clone(), TookOver: tookOver}, err
}

func (r *Runner) toNeedsReconcile(ctx context.Context, st *runState, reason string, tookOver bool) (*Outcome, error) {
	st.leaseEnded.Store(true)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := r.store.SetNeedsReconcile(rctx, st.ref, reason); err != nil {
		// Whatever happened, the mark stays on the row, so the next
		// acquisition lands here again: nothing is re-run blindly.
		r.emit(ctx, st.event(EventStoreError, err))
		if errors.Is(err, ErrLockLost) {
			return &Outcome{Kind: OutcomeLockLost, Record: st.rec.clone(), TookOver: tookOver}, err
		}
		return &Outcome{Kind: OutcomeStoreUnavailable, Record: st.rec.clone(), TookOver: tookOver}, err
	}
	st.rec.Status = StatusNeedsReconcile
	r.emit(ctx, st.event(EventNeedsReconcile, nil))
	r.log.WarnContext(ctx, "idem: key needs reconciliation", "flow", st.rec.Flow, "key", st.rec.Key, "reason", reason)
	return &Outcome{Kind: OutcomeNeedsReconcile, Record: st.rec.clone(), TookOver: tookOver},
		fmt.Errorf("%w: key %q: %s", ErrNeedsReconcile, st.rec.Key, reason)
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
		r.config.Observer.Observe(ctx, e)
	}
}

func (r *Runner) hook(ctx context.Context, st *runState, where HookWhere) error {
	return r.hookAt(ctx, st, HookPoint{Where: where})
}

func (r *Runner) hookAt(ctx context.Context, st *runState, at HookPoint) error {
	if r.config.Test.Hook == nil {
		return nil
	}
	at.Flow, at.Phase, at.Attempt, at.Key = st.flow.Name(), st.phaseName(), st.attempt, st.rec.clone()
	_, at.ForeignKind, _ = st.flow.phaseMeta(st.phase)
	err := r.config.Test.Hook(ctx, at)
	if errors.Is(err, ErrSimulatedCrash) {
		st.crashed = true
	}
	return err
}

func (r *Runner) startRequest(ctx context.Context, flow, scope string) (context.Context, func(*Outcome, error)) {
	if t, ok := r.config.Observer.(Tracer); ok {
		return t.StartRequest(ctx, flow, scope)
	}
	return ctx, func(*Outcome, error) {}
}

func (r *Runner) startPhase(ctx context.Context, flow, phase string, attempt int) (context.Context, func(error)) {
	if t, ok := r.config.Observer.(Tracer); ok {
		return t.StartPhase(ctx, flow, phase, attempt)
	}
	return ctx, func(error) {}
}

// storableResponse drops headers that must never be replayed: credentials,
// cookies and hop-by-hop headers belong to one exchange, not to the stored
// outcome of a request.
func storableResponse(resp *Response) *Response {
	out := &Response{Status: resp.Status, Body: resp.Body, Header: http.Header{}}
	for name, values := range resp.Header {
		if !ReplayableHeader(name) {
			continue
		}
		out.Header[http.CanonicalHeaderKey(name)] = append([]string(nil), values...)
	}
	return out
}

var neverStored = map[string]bool{
	"Set-Cookie": true, "Authorization": true, "Proxy-Authorization": true, "Www-Authenticate": true,
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Te": true, "Trailer": true,
	"Transfer-Encoding": true, "Upgrade": true, "Content-Length": true, "Date": true,
}

// runState is the runner's state for one held request, shared by its
// phases; the per-attempt fields are reset by beginAttempt.
type runState struct {
	runner *Runner
	flow   AnyFlow
	rec    *KeyRecord
	ref    LockRef
	input  any

	phase         int
	attempt       int
	patch         map[string]json.RawMessage
	foreignCalled bool
	// foreignMarked survives attempts: once a not-idempotent call may have
	// happened, the request can only go forward by committing or reconcile.
	foreignMarked bool
	crashed       bool
	// leaseEnded tells the heartbeat goroutine that this worker is letting
	// go of the key (finishing, releasing, handing it to reconcile), so a
	// refused beat is expected rather than a lost lock.
	leaseEnded atomic.Bool
}

func (st *runState) beginAttempt(phase, attempt int) {
	if phase != st.phase {
		st.foreignMarked = false
	}
	st.phase, st.attempt, st.patch, st.foreignCalled = phase, attempt, nil, false
}

func (st *runState) phaseName() string {
	if st.flow == nil { // a reconcile run for a flow this runner does not know
		return ""
	}
	name, _, _ := st.flow.phaseMeta(st.phase)
	return name
}

func (st *runState) downstreamKey() string {
	return "idem-" + st.rec.RequestID + "-" + st.phaseName()
}

// committed updates the in-memory record to what CommitPhase wrote.
func (st *runState) committed(cp CommitParams) {
	st.rec.RecoveryPoint, st.rec.Status, st.rec.ForeignMark = cp.RecoveryPoint, cp.Status, ""
	if st.rec.Checkpoint == nil {
		st.rec.Checkpoint = map[string]json.RawMessage{}
	}
	for n, v := range cp.CheckpointPatch {
		st.rec.Checkpoint[n] = v
	}
	if cp.Response != nil {
		st.rec.ResponseStatus, st.rec.ResponseHeaders, st.rec.ResponseBody = cp.Response.Status, cp.Response.Header, cp.Response.Body
		st.rec.LockedAt, st.rec.LeaseExpiresAt = nil, nil
	}
	st.foreignMarked = false
}

func (st *runState) event(kind EventKind, err error) Event {
	return Event{Kind: kind, Flow: st.rec.Flow, Scope: st.rec.Scope, Key: st.rec.Key, Phase: st.phaseName(), Attempt: st.attempt, Err: err}
}

func (st *runState) foreign(ctx context.Context, name string, call func(ctx context.Context, idempotencyKey string) error) error {
	if st.foreignCalled {
		return fmt.Errorf("%w: phase %q already made its foreign call; %q was not made", ErrSecondForeignCall, st.phaseName(), name)
	}
	st.foreignCalled = true
	_, kind, _ := st.flow.phaseMeta(st.phase)
	if kind == ForeignNotIdempotent && !st.foreignMarked {
		if err := st.runner.store.MarkForeign(ctx, st.ref, st.phaseName()); err != nil {
			return fmt.Errorf("idem: could not record the attempt of %q, so it was not made: %w", name, err)
		}
		st.foreignMarked = true
	}
	key := st.downstreamKey()
	err := call(ctx, key)
	if herr := st.runner.hookAt(ctx, st, HookPoint{Where: HookAfterForeign, Foreign: name, DownstreamKey: key}); herr != nil {
		return herr
	}
	return err
}
