package idemhttp

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
)

// AsyncHeader is the response header that says a request's "Prefer:
// respond-async" was declined: "declined; reason=busy" when
// Config.Detached had no room for another run without its client, so the
// request ran while its client waited.
const AsyncHeader = "Idem-Async"

// asyncDeclinedBusy is the AsyncHeader of a request beyond Config.Detached.
const asyncDeclinedBusy = "declined; reason=busy"

// RequestStatusRunning is the Status of a [RequestStatus]: the request's
// flow has not responded yet.
const RequestStatusRunning = "running"

// RequestStatus is the application/json body of a 202 Accepted answer: from
// the flow's handler (RespondAsync, InProgressAccepted) and from its status
// monitor while the request runs.
type RequestStatus struct {
	// Status is RequestStatusRunning.
	Status string `json:"status"`
	// RecoveryPoint is the name of the request's last committed phase
	// ("started" before the first), where Config.ShowRecoveryPoint allows
	// showing it.
	RecoveryPoint string `json:"recovery_point,omitempty"`
	// Monitor is the status monitor's URL for the request, as in
	// Location, where Config.MonitorURL is set.
	Monitor string `json:"monitor,omitempty"`
}

// executed is how a run of the flow ended.
type executed struct {
	out *idem.Outcome
	err error
}

// execute runs req for r, detached from r's cancellation: a half-done
// multi-phase request would only make its retry resume. Once r's client
// has gone, the run counts against Config.Detached, and a run beyond its
// limit is stopped (its phase rolls back and its key is released, for a
// retry or the completer; a not-idempotent call it stopped is left in
// doubt, for a reconcile run). Values of the request's context (auth, trace
// spans) stay visible to the phases.
func (h *Handler[In]) execute(r *http.Request, req idem.Request) (*idem.Outcome, error) {
	ctx, stopRun := context.WithCancel(context.WithoutCancel(r.Context()))
	defer stopRun()
	var counted atomic.Bool
	left := make(chan struct{})
	stop := context.AfterFunc(r.Context(), func() {
		defer close(left)
		if h.cfg.Detached.enter() {
			counted.Store(true)
			return
		}
		h.log.WarnContext(ctx, "idemhttp: the client left and Config.Detached is full; the run stops and its key is left for a retry or the completer",
			"flow", h.flow.Name(), "detached_limit", h.cfg.Detached.Limit())
		stopRun()
	})
	// Deferred: a run that panics (an Observer's hook) must give its
	// place back, or the bound shrinks by one for good.
	defer func() {
		if !stop() {
			<-left
			if counted.Load() {
				h.cfg.Detached.leave()
			}
		}
	}()
	return h.runner.Execute(ctx, h.flow, req)
}

// serveAsync serves a request that prefers respond-async: its flow runs on
// a goroutine of its own, counted against Config.Detached, and the request
// is answered 202 once its key is held (after wait, when it asked for
// one with Prefer: wait), or the flow's own answer when that comes first.
// It reports false, having answered nothing, when Config.Detached is full:
// the request is then served as if it had not asked.
func (h *Handler[In]) serveAsync(w http.ResponseWriter, r *http.Request, req idem.Request, wait time.Duration, asked bool) bool {
	if !h.cfg.Detached.enter() {
		w.Header().Set(AsyncHeader, asyncDeclinedBusy)
		return false
	}
	acquired := make(chan struct{})
	var once sync.Once
	// The key as held: a key taken over is at its last committed phase,
	// not at "started". Written before close(acquired), read after it.
	recoveryPoint := idemtype.RecoveryPointStarted
	req.Acquired = func(rec *idemtype.KeyRecord) {
		once.Do(func() {
			if rec.RecoveryPoint != "" {
				recoveryPoint = rec.RecoveryPoint
			}
			close(acquired)
		})
	}
	// A key another attempt runs answers 202 at once.
	req.Wait, req.WaitContext = 0, nil
	done := make(chan executed, 1)
	ctx := context.WithoutCancel(r.Context())
	go func() {
		defer h.cfg.Detached.leave()
		defer func() {
			if v := recover(); v != nil {
				h.log.ErrorContext(ctx, "idemhttp: panic in a request answered 202; its key is left for the completer",
					"flow", h.flow.Name(), "panic", v, "stack", string(debug.Stack()))
				done <- executed{&idem.Outcome{Kind: idem.OutcomeFailed}, fmt.Errorf("idemhttp: panic: %v", v)}
			}
		}()
		out, err := h.runner.Execute(ctx, h.flow, req)
		done <- executed{out, err}
	}()
	select {
	case e := <-done:
		h.writeResult(w, r, req, e, true)
		return true
	case <-acquired:
	}
	if asked && wait > 0 {
		timer := time.NewTimer(wait)
		defer timer.Stop()
		select {
		case e := <-done:
			h.writeResult(w, r, req, e, true)
			return true
		case <-timer.C:
		case <-r.Context().Done():
		}
	}
	select {
	case e := <-done: // it ended already: its answer, not a 202
		h.writeResult(w, r, req, e, true)
	default:
		h.writeAccepted(w, req.Key, recoveryPoint, true)
	}
	return true
}

// writeResult writes how a run ended: a key another attempt runs is 202
// Accepted to a request that preferred respond-async (async) or with
// Config.InProgress set to InProgressAccepted; the rest is writeOutcome's.
func (h *Handler[In]) writeResult(w http.ResponseWriter, r *http.Request, req idem.Request, e executed, async bool) {
	inFlight := e.out.Kind == idem.OutcomeInProgress || e.out.Kind == idem.OutcomeLockLost
	if inFlight && (async || h.cfg.InProgress == InProgressAccepted) {
		recoveryPoint := ""
		if e.out.Record != nil {
			recoveryPoint = e.out.Record.RecoveryPoint
		}
		h.writeAccepted(w, req.Key, recoveryPoint, async)
		return
	}
	h.writeOutcome(w, r, req, e.out, e.err)
}

// writeAccepted answers 202 Accepted for the running request of key, at
// recoveryPoint: Retry-After, the monitor's Location, and a RequestStatus;
// Preference-Applied: respond-async when the request preferred it.
func (h *Handler[In]) writeAccepted(w http.ResponseWriter, key, recoveryPoint string, async bool) {
	status := RequestStatus{Status: RequestStatusRunning, Monitor: h.monitorLocation(key)}
	if h.cfg.ShowRecoveryPoint {
		status.RecoveryPoint = recoveryPoint
	}
	header := w.Header()
	if status.Monitor != "" {
		header.Set("Location", status.Monitor)
	}
	if async {
		header.Set("Preference-Applied", "respond-async")
		header.Del(AsyncHeader) // a retry declined for want of room, answered 202 all the same
	}
	header.Set("Retry-After", strconv.FormatInt(int64(h.cfg.AsyncRetryAfter/time.Second), 10))
	writeJSON(w, http.StatusAccepted, status)
}

// monitorLocation is the status monitor's URL for key: Config.MonitorURL
// with the query parameter key; "" without a MonitorURL.
func (h *Handler[In]) monitorLocation(key string) string {
	if h.cfg.MonitorURL == "" {
		return ""
	}
	u, err := url.Parse(h.cfg.MonitorURL)
	if err != nil { // Config.apply parsed it
		return ""
	}
	q := u.Query()
	q.Set(monitorKeyParameter, key)
	u.RawQuery = q.Encode()
	return u.String()
}

// writeJSON writes v, which cannot fail to encode, as application/json.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("idemhttp: encode %T: %v", v, err))
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
