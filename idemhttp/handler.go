package idemhttp

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"slices"
	"time"

	"github.com/go-idem/idem"
)

// ErrUnauthenticated is what a Config.Scope function returns when the
// request carries no valid credentials. Any error from Scope answers 401
// (unless it is a *Problem, which is answered as it is); returning this one,
// or an error wrapping it, says so plainly.
var ErrUnauthenticated = errors.New("idemhttp: unauthenticated")

// Handler serves one flow over HTTP with the Idempotency-Key contract
// described in the package documentation. It is safe for concurrent use.
type Handler[In any] struct {
	runner *idem.Runner
	flow   *idem.Flow[In]
	cfg    Config[In]
	log    *slog.Logger
	// replay lists the canonical names of the headers sent and replayed,
	// Content-Type first.
	replay []string
}

// New turns a flow into an http.Handler. runner runs it; cfg must set Scope.
func New[In any](runner *idem.Runner, flow *idem.Flow[In], cfg *Config[In]) (*Handler[In], error) {
	if runner == nil {
		return nil, errors.New("idemhttp: New needs a runner")
	}
	if flow == nil {
		return nil, errors.New("idemhttp: New needs a flow")
	}
	if cfg == nil || cfg.Scope == nil {
		return nil, errors.New("idemhttp: Config.Scope is required: derive the key's scope (tenant or user) from the authenticated request; there is no global scope")
	}
	if err := registered(runner, flow); err != nil {
		return nil, fmt.Errorf("idemhttp: %w", err)
	}
	h := &Handler[In]{runner: runner, flow: flow, cfg: *cfg}
	replay, err := h.cfg.apply()
	if err != nil {
		return nil, fmt.Errorf("idemhttp: invalid config for flow %q: %w", flow.Name(), err)
	}
	if h.cfg.RespondAsync && !flow.Redrives() {
		return nil, fmt.Errorf("idemhttp: Config.RespondAsync for flow %q, which the completer does not re-drive (NoRedrive): "+
			"a request answered 202 whose process dies would never finish", flow.Name())
	}
	h.replay = replay
	h.log = cmp.Or(h.cfg.Logger, runner.Config().Logger)
	return h, nil
}

// registered refuses a flow the runner does not know (missing from its
// idem.Config.Flows, or another flow under its name): its requests would
// run, but the completer, which claims only the keys of the runner's
// flows, would never finish one whose client gave up.
func registered[In any](runner *idem.Runner, flow *idem.Flow[In]) error {
	known, ok := runner.Flow(flow.Name())
	switch {
	case !ok:
		return fmt.Errorf("flow %q is not in the runner's idem.Config.Flows: its requests would run, "+
			"but the completer would never finish one whose client gave up; add the flow there", flow.Name())
	case known != idem.AnyFlow(flow):
		return fmt.Errorf("the runner's idem.Config.Flows holds another flow named %q: "+
			"give the runner and the handler the same *idem.Flow", flow.Name())
	}
	return nil
}

// ServeHTTP runs the flow for POST and PATCH. Any other method answers 405
// with Allow: POST, PATCH; use [Handler.Middleware] to serve other methods
// of the same path with another handler.
func (h *Handler[In]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !runsFlow(r.Method) {
		h.writeProblem(w, h.methodNotAllowed(r.Method, []string{http.MethodPost, http.MethodPatch}))
		return
	}
	h.serveFlow(w, r)
}

// MethodNotAllowed returns a handler that answers every request 405
// ProblemMethodNotAllowed, in the handler's profile, with Allow listing
// allow. Mount it beside a method pattern, so that the route's other
// methods get a problem rather than ServeMux's plain-text 405:
//
//	mux.Handle("POST /rides", rides)
//	mux.Handle("/rides", rides.MethodNotAllowed(http.MethodPost))
func (h *Handler[In]) MethodNotAllowed(allow ...string) http.Handler {
	allow = slices.Clone(allow)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.writeProblem(w, h.methodNotAllowed(r.Method, allow))
	})
}

// Middleware runs the flow for POST and PATCH and passes every other method
// (GET, HEAD, PUT, DELETE, OPTIONS, ...) to next untouched: those need no
// Idempotency-Key and record nothing.
func (h *Handler[In]) Middleware(next http.Handler) http.Handler {
	if next == nil {
		panic("idemhttp: Middleware needs a next handler")
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runsFlow(r.Method) {
			h.serveFlow(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func runsFlow(method string) bool {
	return method == http.MethodPost || method == http.MethodPatch
}

// Flow returns the flow the handler serves.
func (h *Handler[In]) Flow() *idem.Flow[In] { return h.flow }

// WriteProblem writes p in the handler's profile; see the package-level
// [WriteProblem].
func (h *Handler[In]) WriteProblem(w http.ResponseWriter, p *Problem) {
	WriteProblem(w, h.cfg.Profile, p)
}

// ProblemType returns the type URI of one of the adapter's problems, given
// its name (a Problem* constant).
func (h *Handler[In]) ProblemType(name string) string { return h.cfg.ProblemTypeBase + name }

// recoverPanic, deferred, answers a panic in a Config hook with
// ProblemInternal, unless the response may have begun (*responded).
func (h *Handler[In]) recoverPanic(w http.ResponseWriter, r *http.Request, responded *bool) {
	v := recover()
	if v == nil {
		return
	}
	if v == http.ErrAbortHandler { // a deliberate abort: let net/http drop the connection
		panic(v)
	}
	if *responded {
		// The response may have begun: a problem now could only corrupt
		// it. net/http logs the panic and drops the connection, which
		// the client retries.
		panic(v)
	}
	h.log.ErrorContext(r.Context(), "idemhttp: panic while handling a request; nothing was recorded for its key",
		"flow", h.flow.Name(), "panic", v, "stack", string(debug.Stack()))
	h.writeProblem(w, h.problem(specInternal, internalDetail))
}

func (h *Handler[In]) serveFlow(w http.ResponseWriter, r *http.Request) {
	responded := false
	defer h.recoverPanic(w, r, &responded)
	echoKey(w.Header(), r.Header, h.cfg.MinKeyLength)

	req, p := h.admit(w, r)
	if p != nil && !req.RetryOnly {
		responded = true
		h.writeProblem(w, p)
		return
	}
	// Prefer is read only for a request that is to run (bounded and
	// without allocating, preferWait), and the wait ends when the client
	// goes away (WaitContext); the flow itself, once run, does not. A
	// request that asks nothing waits Config.DefaultWait (requestWait).
	wait, asked := requestWait(r.Header, h.cfg.MaxWait, h.cfg.DefaultWait)
	req.Wait, req.WaitContext = wait, r.Context()
	if p != nil {
		// A body this release refuses may be the retry of a request an
		// earlier one accepted: the key made from these bytes answers it
		// (a replay, or its resumption); with no such key, the problem.
		out, err := h.execute(r, req)
		responded = true
		h.applied(w, out, wait, asked)
		if errors.Is(err, idem.ErrNotFound) || errors.Is(err, idem.ErrMismatch) || errors.Is(err, idem.ErrNoRedrive) ||
			errors.Is(err, idem.ErrInvalidRequest) {
			h.writeProblem(w, p)
			return
		}
		h.writeResult(w, r, req, executed{out, err}, false)
		return
	}
	async := h.cfg.RespondAsync && preferRespondAsync(r.Header)
	if async {
		responded = true // the flow may answer from here on
		if h.serveAsync(w, r, req, wait, asked) {
			return
		}
	}
	// The flow runs to completion even if the client goes away (execute).
	// A request declined respond-async for want of room still gets the
	// 202 of a key in flight: it ran nothing.
	out, err := h.execute(r, req)
	responded = true
	h.applied(w, out, wait, asked)
	h.writeResult(w, r, req, executed{out, err}, async)
}

// echoKey sends the request's Idempotency-Key back, as the client sent it,
// on every answer to a request that carries a valid one: Stripe's
// convention, which its SDKs read into the response of a failed call, where
// the application's retry takes it from. Without it such a retry makes a
// new key, while the completer finishes the first request: a second effect.
// A missing or malformed key (as admit refuses it: one ParseKey refuses,
// or one shorter than Config.MinKeyLength) has nothing to echo.
func echoKey(dst, request http.Header, minLength int) {
	values := request.Values("Idempotency-Key")
	if key, err := ParseKey(values); err != nil || len(key) < minLength {
		return
	}
	for _, v := range values {
		if v = trimOWS(v); v != "" {
			dst.Set("Idempotency-Key", v)
			return
		}
	}
}

// applied answers Preference-Applied: wait=N (the wait the handler granted,
// Prefer's capped by Config.MaxWait, or Config.DefaultWait where MaxWait is 0) when the request asked to wait and
// waited for another attempt of its key; Config.DefaultWait was asked by
// no one and is not announced.
func (h *Handler[In]) applied(w http.ResponseWriter, out *idem.Outcome, wait time.Duration, asked bool) {
	if asked && out.Waited > 0 {
		w.Header().Set("Preference-Applied", preferenceApplied(wait))
	}
}
