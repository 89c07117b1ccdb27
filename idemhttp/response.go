package idemhttp

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/hooks"
)

// StatusClientClosedRequest (499, nginx's "client closed request") is what
// the handler answers, without a body, when the runner reports
// idem.OutcomeCanceled: the caller went away, nothing was stored, and a
// retry with the same key resumes. Access logs show it apart from the
// server's own failures.
const StatusClientClosedRequest = 499

// writeOutcome maps the runner's outcome to the response.
func (h *Handler[In]) writeOutcome(w http.ResponseWriter, r *http.Request, req idem.Request, out *idem.Outcome, err error) {
	ctx := r.Context()
	if errors.Is(err, hooks.ErrSimulatedCrash) {
		// A test hook simulated a crash. A dead server sends nothing, so the
		// client sees the connection drop, as it would.
		panic(http.ErrAbortHandler)
	}
	switch out.Kind {
	case idem.OutcomeExecuted:
		h.writeResponse(w, r, out.Response, false)
	case idem.OutcomeReplayed:
		h.writeResponse(w, r, out.Response, true)
	case idem.OutcomeInProgress:
		p := h.problem(h.inProgress(req), "A request with this Idempotency-Key is still being processed. "+
			"Retry after the time in Retry-After to get its result.")
		p.Header = retryAfter(out.RetryAfter)
		h.writeProblem(w, p)
	case idem.OutcomeLockLost:
		// Another worker took the key over (this one was presumed dead) and
		// owns the request now: for the client it is in progress.
		p := h.problem(h.inProgress(req), "Another attempt of this request took it over while this one ran. "+
			"Retry after the time in Retry-After to get its result.")
		p.Header = retryAfter(time.Second)
		h.writeProblem(w, p)
	case idem.OutcomeTooManyKeys:
		p := h.problem(specTooManyKeys, "Too many requests with new Idempotency-Keys; nothing was recorded for this one. "+
			"Retry it with the same key after the time in Retry-After.")
		p.Header = retryAfter(out.RetryAfter)
		h.writeProblem(w, p)
	case idem.OutcomeMismatch:
		h.writeProblem(w, h.problem(specKeyReused, "This Idempotency-Key was already used for a different request "+
			"(another endpoint or other parameters). Use a new key for a new request, and the same key only to retry the same request."))
	case idem.OutcomeNeedsReconcile:
		p := h.problem(specNeedsReconcile, "This request called an outside system, and whether that call took effect is not known yet. "+
			"The request will not run again until that is settled; retry after the time in Retry-After to get its final result.")
		p.Header = retryAfter(h.cfg.ReconcileRetryAfter)
		h.writeProblem(w, p)
	case idem.OutcomeRequestAbandoned:
		h.writeProblem(w, h.problem(specRequestAbandoned, "This request was given up by an operator while its outcome was in doubt, "+
			"and it will not run. Retrying with this Idempotency-Key gets this answer again; to make the request anew, use a new key."))
	case idem.OutcomeStoreUnavailable:
		h.writeProblem(w, h.storeUnavailable("The idempotency key store could not be reached, so the request could not be completed. "+
			"Retry it with the same Idempotency-Key: it resumes where it stopped, and nothing runs twice."))
	case idem.OutcomeFailed:
		p := h.problem(specRequestFailed, "The request failed before it completed. Its Idempotency-Key stays bound to this request "+
			"and keeps the steps that completed: retry it with the same key and the same body, and it resumes where it stopped.")
		if h.flow.Redrives() {
			// The completer finishes it whether the client retries or
			// not: a client that gives up must not make it anew.
			p.Code = CodeRequestUnfinished
			p.Detail += " If you do not retry, the server finishes it."
			if p.Stripe != nil {
				p.Stripe.Code, p.Stripe.Message = CodeRequestUnfinished, p.Detail
			}
		}
		h.writeProblem(w, p)
	case idem.OutcomeCanceled:
		// The runner's caller went away. The handler runs the flow detached
		// from the request's cancellation, so this is a runner shared with
		// code that cancels it; the client is gone either way. Nothing was
		// stored and the key was released: answer 499 (nginx's "client
		// closed request") without a body, for access logs, and log nothing
		// at error.
		w.WriteHeader(StatusClientClosedRequest)
	case idem.OutcomeInvalid:
		if errors.Is(err, idem.ErrInvalidParams) {
			// Input that decoded but cannot be kept, such as a NUL
			// character in a string.
			h.writeProblem(w, h.problem(specInvalidInput, "The request body is invalid: "+clip(strings.TrimPrefix(err.Error(), idem.ErrInvalidParams.Error()+": "))+"."))
			return
		}
		fallthrough
	default: // a scope the runner refuses, or a kind this adapter does not know
		h.log.ErrorContext(ctx, "idemhttp: the runner refused the request; check Config.Scope and the input type",
			h.runner.LogAttrs(req.Scope, req.Key, out.Record, "flow", h.flow.Name(), "outcome", out.Kind, "err", h.runner.LogError(err, req.Scope, req.Key))...)
		h.writeProblem(w, h.problem(specInternal, internalDetail))
	}
}

// inProgress is the problem for a key in flight: after a wait (the
// request's Wait, Config.DefaultWait or Prefer's) the Stripe profile's 429
// lock_timeout, which the Stripe SDKs retry; without one, the 409.
func (h *Handler[In]) inProgress(req idem.Request) problemSpec {
	if req.Wait > 0 {
		return specInProgressWaited
	}
	return specInProgress
}

// writeResponse writes a flow's response: the stored status and body, and
// of its headers only Content-Type and Config.ReplayHeaders, so the first
// response and every replay are the same.
func (h *Handler[In]) writeResponse(w http.ResponseWriter, r *http.Request, resp *idemtype.Response, replayed bool) {
	if resp == nil || resp.Status < 200 || resp.Status > 599 {
		status := 0
		if resp != nil {
			status = resp.Status
		}
		h.log.ErrorContext(r.Context(), "idemhttp: the flow's response has an invalid status code", "flow", h.flow.Name(), "status", status)
		h.writeProblem(w, h.problem(specInternal, "The server produced an invalid response."))
		return
	}
	copyAllowed(w.Header(), resp.Header, h.replay)
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	if bodyAllowed(resp.Status) {
		w.Header().Set("Content-Length", strconv.Itoa(len(resp.Body)))
	}
	w.WriteHeader(resp.Status)
	if bodyAllowed(resp.Status) {
		_, _ = w.Write(resp.Body)
	}
}

// copyAllowed copies the allowed headers of src to dst. A phase may have
// built its header map by hand with non-canonical names, so names are
// matched canonically; the canonical spelling wins over others.
func copyAllowed(dst, src http.Header, allowed []string) {
	for _, name := range allowed {
		values, ok := src[name]
		if !ok {
			for k, v := range src {
				if http.CanonicalHeaderKey(k) == name {
					values, ok = v, true
					break
				}
			}
		}
		if ok && len(values) > 0 {
			dst[name] = append([]string(nil), values...)
		}
	}
}

func bodyAllowed(status int) bool {
	return status != http.StatusNoContent && status != http.StatusNotModified
}

// retryAfter renders d as a Retry-After header. d is whole seconds, at
// least one, where it comes from: the runner rounds Outcome.RetryAfter up,
// and Config.apply rounds the configured durations up. So it is formatted,
// never rounded a second time.
func retryAfter(d time.Duration) http.Header {
	return http.Header{"Retry-After": {strconv.FormatInt(int64(d/time.Second), 10)}}
}
