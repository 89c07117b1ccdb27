package idemhttp

import (
	"errors"
	"net/http"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
)

// monitorKeyParameter is the query parameter of a status monitor URL that
// carries the request's Idempotency-Key: a query parameter rather than a
// path segment, so that every key (one holding "/", or the key "..") makes
// a URL no router cleans or redirects.
const monitorKeyParameter = "key"

// Monitor returns the handler's status monitor: an http.Handler that
// answers GET (and HEAD) for the request whose Idempotency-Key is the query
// parameter key, as the Location of a 202 Accepted names it
// (Config.MonitorURL). Mount it at MonitorURL behind the same
// authentication as the flow: it derives the caller's scope with the same
// Config.Scope, and finds only the caller's own keys of this flow, so a
// URL used with another tenant's credentials is 404, like a key that does
// not exist. It answers:
//
//	running            202 Accepted, Retry-After (Config.AsyncRetryAfter), a RequestStatus body
//	finished           the stored response itself, as a retry of the POST gets it (Idempotent-Replayed: true)
//	needs reconcile    503 request-needs-reconcile, Retry-After (Config.ReconcileRetryAfter)
//	abandoned          410 request-abandoned
//	unknown, expired   404 request-not-found (also another scope's or another flow's key)
//
// A finished request is answered its stored response rather than a 303
// See Other: the only URL that holds that response is the POST itself,
// which a redirect cannot make a GET repeat, and the resource the flow
// created (if any; a declined payment created none) is the application's,
// with its own authorization and answer. Every answer of the monitor, the
// stored response included, carries Cache-Control: no-store: it changes
// while the request runs, and its URL is the same for every tenant that
// uses the key.
func (h *Handler[In]) Monitor() http.Handler {
	return http.HandlerFunc(h.serveMonitor)
}

func (h *Handler[In]) serveMonitor(w http.ResponseWriter, r *http.Request) {
	responded := false
	defer h.recoverPanic(w, r, &responded)
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.writeMonitorProblem(w, h.methodNotAllowed(r.Method, []string{http.MethodGet, http.MethodHead}))
		return
	}
	scope, p := h.scope(r)
	if p != nil {
		h.writeMonitorProblem(w, p)
		return
	}
	key, p := h.monitorKey(r)
	if p != nil {
		h.writeMonitorProblem(w, p)
		return
	}
	rec, now, err := h.runner.GetKey(r.Context(), scope, key)
	switch {
	case errors.Is(err, idem.ErrNotFound):
		h.writeMonitorProblem(w, h.requestNotFound())
		return
	case err != nil:
		h.log.ErrorContext(r.Context(), "idemhttp: the status monitor could not read the key",
			h.runner.LogAttrs(scope, key, nil, "flow", h.flow.Name(), "err", h.runner.LogError(err, scope, key))...)
		h.writeMonitorProblem(w, h.storeUnavailable("The idempotency key store could not be reached. Retry after the time in Retry-After."))
		return
	case rec.Flow != h.flow.Name():
		// Another endpoint's key of the caller's: not this monitor's.
		h.writeMonitorProblem(w, h.requestNotFound())
		return
	}
	responded = true
	switch rec.State(now) {
	case idemtype.KeyStateFinished:
		if rec.RecoveryPoint == idemtype.RecoveryPointAbandoned {
			h.writeMonitorProblem(w, h.problem(specRequestAbandoned, "This request was given up by an operator while its outcome was in doubt, "+
				"and it will not run. To make the request anew, use a new Idempotency-Key."))
			return
		}
		// no-store here too, whatever Cache-Control the flow stored for
		// its POST: the monitor's URL is the same for every tenant that
		// uses the key, so a cache that kept one's answer (a cookie-
		// authenticated one, which shared caches may store) would show it
		// to another.
		w.Header().Set("Cache-Control", "no-store")
		h.writeResponse(w, r, withoutCacheControl(rec.Response()), true)
	case idemtype.KeyStateNeedsReconcile:
		p := h.problem(specNeedsReconcile, "This request called an outside system, and whether that call took effect is not known yet. "+
			"Retry after the time in Retry-After to get its final result.")
		p.Header = retryAfter(h.cfg.ReconcileRetryAfter)
		h.writeMonitorProblem(w, p)
	case idemtype.KeyStateExpired:
		h.writeMonitorProblem(w, h.requestNotFound())
	default: // running, or stale: left for a retry or the completer
		w.Header().Set("Cache-Control", "no-store")
		h.writeAccepted(w, key, rec.RecoveryPoint, false)
	}
}

// withoutCacheControl is resp without its Cache-Control header, which the
// monitor replaces with its own.
func withoutCacheControl(resp *idemtype.Response) *idemtype.Response {
	if resp == nil || resp.Header.Get("Cache-Control") == "" {
		return resp
	}
	out := *resp
	out.Header = resp.Header.Clone()
	out.Header.Del("Cache-Control")
	return &out
}

// monitorKey is the Idempotency-Key a status monitor request names, or the
// problem that refuses it.
func (h *Handler[In]) monitorKey(r *http.Request) (string, *Problem) {
	keys := r.URL.Query()[monitorKeyParameter]
	switch {
	case len(keys) == 0 || keys[0] == "":
		return "", h.problem(specKeyMissing, "The status monitor needs the request's Idempotency-Key in the query parameter key.")
	case len(keys) > 1:
		return "", h.problem(specKeyMalformed, "The query parameter key is given more than once; give one Idempotency-Key.")
	case !idem.ValidKey(keys[0]) || len(keys[0]) < h.cfg.MinKeyLength:
		return "", h.problem(specKeyMalformed, "The query parameter key is not a valid Idempotency-Key of this endpoint.")
	}
	return keys[0], nil
}

func (h *Handler[In]) requestNotFound() *Problem {
	return h.problem(specRequestNotFound, "There is no request with this Idempotency-Key for the caller at this endpoint: "+
		"it was never made, it was made by another caller, or it has expired.")
}

// writeMonitorProblem writes p with Cache-Control: no-store: the monitor's
// answer about a request changes as the request runs.
func (h *Handler[In]) writeMonitorProblem(w http.ResponseWriter, p *Problem) {
	w.Header().Set("Cache-Control", "no-store")
	h.writeProblem(w, p)
}
