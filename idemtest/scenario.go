package idemtest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-idem/idem"
)

// scenario is the live state of one scenario; report is what it tells.
type scenario struct {
	report   *Scenario
	scope    string
	userHook func(context.Context, HookPoint) error
	clock    *Clock
	marks    []int
	// input is the In the scenario sends.
	input any
	// handed is the exploration's downstream keys by scenario key
	// (explorer.handed); ended its count of ended scenarios.
	handed *sync.Map
	ended  *atomic.Int64

	mu      sync.Mutex
	workers int
	commits map[string]int // phase -> commits, by the phase or its reconcile hook
	order   []string       // phases in the order they first committed
	notDone map[string]int // phase -> reconcile verdicts of not done
	calls   []foreignCall
	// upgrade: the first attempt ran Config.PreviousFlow (runUpgrade).
	upgrade bool

	// The last worker step, to fold repeats into it.
	lastCall        string
	lastCallStep    int
	lastCallRepeats int
}

type foreignCall struct {
	worker int
	phase  string
	name   string
	key    string
	kind   idem.ForeignKind
}

// end records that the scenario ended, for the order Report.Failed gives.
func (sc *scenario) end() {
	sc.report.ended = sc.ended.Add(1)
}

func (sc *scenario) newWorker(f *fault) *worker {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.workers++
	return &worker{sc: sc, n: sc.workers, fault: f}
}

func (sc *scenario) step(format string, args ...any) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.report.Steps = append(sc.report.Steps, fmt.Sprintf(format, args...))
}

// workerStep records worker n's call. Calls that went exactly like the
// previous step's (a retry loop that makes no progress) share its line.
func (sc *scenario) workerStep(n int, call string) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	steps := sc.report.Steps
	if len(steps) > 0 && sc.lastCall == call && sc.lastCallStep == len(steps)-1 {
		sc.lastCallRepeats++
		steps[len(steps)-1] = fmt.Sprintf("workers %d to %d, %d alike: %s", n-sc.lastCallRepeats+1, n, sc.lastCallRepeats, call)
		return
	}
	sc.report.Steps = append(steps, fmt.Sprintf("worker %d %s", n, call))
	sc.lastCall, sc.lastCallStep, sc.lastCallRepeats = call, len(sc.report.Steps)-1, 1
}

func (sc *scenario) violate(format string, args ...any) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.violateLocked(format, args...)
}

func (sc *scenario) violateLocked(format string, args ...any) {
	sc.report.Violations = append(sc.report.Violations, fmt.Sprintf(format, args...))
}

func (sc *scenario) advance(d time.Duration, why string) {
	sc.clock.Advance(d)
	sc.step("clock +%s: %s", d, why)
}

// commit counts a commit of phase by worker w. Call with sc.mu held.
func (sc *scenario) commitLocked(w *worker, phase, how string) {
	if sc.commits[phase] == 0 {
		sc.order = append(sc.order, phase)
	}
	sc.commits[phase]++
	w.notes = append(w.notes, "committed "+phase+how)
}
