package idemtest

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
)

// worker is one runner making one call: a process of its own.
type worker struct {
	sc    *scenario
	n     int
	fault *fault
	// flow is the worker's own flow (*idem.Flow[In]) with Config.NewFlow.
	flow idem.AnyFlow

	// trips, when set, records how many round trips the worker had sent
	// through a fault proxy at each hook point of its key (the wire
	// baseline).
	trips func() int64

	// Guarded by sc.mu.
	notes     []string
	tripMarks []tripMark
}

func (w *worker) hook(ctx context.Context, at HookPoint) error {
	ours := at.Key != nil && at.Key.Scope == w.sc.scope && at.Key.Key == w.sc.report.Key
	if ours {
		// Record first: what happened happened, whatever the user's hook
		// then decides.
		switch at.Where {
		case HookBeforeForeign:
			// Before the call leaves: a provider may see it before
			// HookAfterForeign, and must tell whose it is.
			w.sc.handed.Store(at.DownstreamKey, w.sc.report.Key)
		case HookAfterForeign:
			w.sc.handed.Store(at.DownstreamKey, w.sc.report.Key)
			w.foreignCall(at)
		case HookForeignRefused:
			w.refused(at)
		}
		if w.trips != nil {
			w.sc.mu.Lock()
			w.tripMarks = append(w.tripMarks, tripMark{where: at.Where, phase: at.Phase, sent: w.trips()})
			w.sc.mu.Unlock()
		}
	}
	if w.sc.userHook != nil {
		if err := w.sc.userHook(ctx, at); err != nil {
			return err
		}
	}
	f := w.fault
	if !ours {
		return nil
	}
	if f != nil && !f.fired && at.Phase == f.phase {
		f.bypass.note(ctx, at.Where) // see bypass.go
	}
	if f == nil || f.fired || at.Phase != f.phase || at.Where != f.kind.where() {
		return nil
	}
	f.fired = true
	f.finished = at.Key.Status == idemtype.StoredFinished
	f.bypass.strike(ctx) // see bypass.go
	return f.inject(ctx, w)
}

func (w *worker) observe(e idem.Event) {
	if e.Scope != w.sc.scope || e.Key != w.sc.report.Key {
		return
	}
	sc := w.sc
	sc.mu.Lock()
	defer sc.mu.Unlock()
	switch e.Kind {
	case idem.EventPhaseCommitted:
		sc.commitLocked(w, e.Phase, "")
	case idem.EventReconciled:
		switch e.Verdict {
		case "happened":
			// The runner committed the phase in the hook's stead; its
			// EventPhaseCommitted counted it.
			w.notes = append(w.notes, "reconcile verdict for "+e.Phase+": happened")
		case "not_happened":
			sc.notDone[e.Phase]++
			w.notes = append(w.notes, "reconcile verdict for "+e.Phase+": not happened, so the phase runs again")
		default:
			w.notes = append(w.notes, fmt.Sprintf("the reconcile hook of %s gave no verdict: %v", e.Phase, e.Err))
		}
	}
}

func (w *worker) foreignCall(at HookPoint) {
	sc := w.sc
	sc.mu.Lock()
	defer sc.mu.Unlock()
	c := foreignCall{worker: w.n, phase: at.Phase, name: at.Foreign, key: at.DownstreamKey, kind: idem.ForeignKind(at.ForeignKind)}
	sc.calls = append(sc.calls, c)
	if c.kind == idem.ForeignNotIdempotent {
		w.notes = append(w.notes, fmt.Sprintf("made the not-idempotent call %q of %s", c.name, c.phase))
		n := 0
		for _, other := range sc.calls {
			if other.phase == c.phase && other.kind == idem.ForeignNotIdempotent {
				n++
			}
		}
		if n > 1+sc.notDone[c.phase] {
			sc.violateLocked("the not-idempotent foreign call %q of phase %q ran %d times with %d reconcile verdicts of not happened between: it was repeated blindly", c.name, c.phase, n, sc.notDone[c.phase])
		}
		return
	}
	w.notes = append(w.notes, fmt.Sprintf("called %q of %s with key %s", c.name, c.phase, c.key))
}

// refused records a foreign call the runner refused. The call was not
// made: whatever the phase then did, an effect the flow meant to have is
// missing, or the phase fails on every retry.
func (w *worker) refused(at HookPoint) {
	sc := w.sc
	sc.mu.Lock()
	defer sc.mu.Unlock()
	w.notes = append(w.notes, fmt.Sprintf("was refused the foreign call %q of %s", at.Foreign, at.Phase))
	v := fmt.Sprintf("phase %q called Attempt.Foreign for %q after its transaction had made its one foreign call, and the runner refused it, so %q was never made (%v): give the call a phase of its own; a phase that logs the refusal and goes on loses the effect", at.Phase, at.Foreign, at.Foreign, at.Err)
	if !slices.Contains(sc.report.Violations, v) {
		sc.violateLocked("%s", v)
	}
}

// describe is the worker's call as a step, without the worker's number:
// the call, what the worker did, and how it ended.
func (w *worker) describe(o op, ended string) string {
	w.sc.mu.Lock()
	defer w.sc.mu.Unlock()
	var b strings.Builder
	b.WriteString(string(o))
	for _, n := range w.notes {
		b.WriteString("; " + n)
	}
	b.WriteString(" -> " + ended)
	return b.String()
}

func outcomeText(out *idem.Outcome, err error) string {
	s := string(out.Kind)
	if out.Response != nil {
		s += fmt.Sprintf(" %d", out.Response.Status)
	}
	if out.TookOver {
		s += " (took over)"
	}
	if err != nil {
		s += ": " + err.Error()
	}
	return s
}

// observerFor records events for w and passes them on to the user's
// observer, keeping its Tracer side if it has one.
func observerFor(w *worker, user idem.Observer) idem.Observer {
	o := &recordingObserver{w: w, user: user}
	if t, ok := user.(idem.Tracer); ok {
		return &recordingTracer{recordingObserver: o, tracer: t}
	}
	return o
}

type recordingObserver struct {
	w    *worker
	user idem.Observer
}

func (o *recordingObserver) Observe(ctx context.Context, e idem.Event) {
	o.w.observe(e)
	if o.user != nil {
		o.user.Observe(ctx, e)
	}
}

type recordingTracer struct {
	*recordingObserver
	tracer idem.Tracer
}

func (t *recordingTracer) StartRequest(ctx context.Context, flow, scope string) (context.Context, func(*idem.Outcome, error)) {
	return t.tracer.StartRequest(ctx, flow, scope)
}

func (t *recordingTracer) StartPhase(ctx context.Context, flow, phase string, attempt int) (context.Context, func(error)) {
	return t.tracer.StartPhase(ctx, flow, phase, attempt)
}
