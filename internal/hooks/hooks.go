// Package hooks is the runner's test hook: the points of a phase's life a
// test can stop, fail or crash the runner at. It is internal so that it is
// no part of idem's API: package idem calls the hook, and package idemtest,
// the tests' one way in, sets it (idemtest.SetHook) and re-exports the
// names a test needs.
package hooks

import (
	"context"
	"errors"

	"github.com/go-idem/idem/idemtype"
)

// Func is a runner's test hook. Returning ErrSimulatedCrash makes the runner
// stop as a dead process would: its open transaction rolls back and nothing
// is released. Returning another error fails the phase as if the phase had
// returned it (a serialization failure is retried), except at AfterCommit,
// where it plays a lost commit acknowledgement: the phase did commit, but
// the runner sees the commit fail, re-reads the key under its fence, finds
// the commit landed and goes on.
type Func func(ctx context.Context, at Point) error

// ErrSimulatedCrash is returned by a hook to make the runner behave as if
// its process died at that point: the open transaction is rolled back (as
// the server would on a dropped connection) and nothing is released. The
// runner returns it, and the adapters answer as a dead server would (they
// drop the connection).
var ErrSimulatedCrash = errors.New("idem: simulated crash")

// Point says where a hook is being called.
type Point struct {
	Where   Where
	Flow    string
	Phase   string
	Attempt int
	// Key is the key as the runner knows it at that point.
	Key *idemtype.KeyRecord
	// ForeignKind is the phase's declared Phase.Foreign (an idem.ForeignKind),
	// so a test can tell a not-idempotent call (which must never run twice)
	// from one the provider deduplicates.
	ForeignKind int
	// Foreign and DownstreamKey describe the foreign call at BeforeForeign
	// and AfterForeign: the name given to the foreign call and the
	// idempotency key the call receives.
	Foreign       string
	DownstreamKey string
	// Err is the refusal at ForeignRefused.
	Err error
}

// Where names a point in a phase's life.
//
// Phases joined by Phase.JoinPrevious pass the same points as phases of
// their own, in order, around the one transaction they share: a joined
// phase's PhaseStart comes after the phase before it reached BeforeCommit,
// in the same transaction, and once the shared commit landed every one of
// them reaches AfterCommit.
type Where string

const (
	// PhaseStart: the phase's transaction has begun; its body has not run.
	PhaseStart Where = "phase_start"
	// BeforeForeign: the phase is about to make its foreign call (a
	// not-idempotent phase has recorded its mark); the call has not been
	// made. A test that pauses here past the lease sees the worker fence
	// itself off.
	BeforeForeign Where = "before_foreign"
	// AfterForeign: the phase's foreign call has returned; the phase has
	// not committed.
	AfterForeign Where = "after_foreign"
	// BeforeCommit: the phase's body returned; the guarded commit has not
	// been sent.
	BeforeCommit Where = "before_commit"
	// AfterCommit: the phase committed; the caller has not been told.
	AfterCommit Where = "after_commit"
	// ForeignRefused: the runner refused a foreign call of the phase (a
	// second one in its transaction, idem.ErrSecondForeignCall): Foreign
	// names it, Err is the refusal the phase gets. The call was not made; a
	// phase that goes on without it has lost an effect, which a test (the
	// crash kit) reports. An error the hook returns is returned in the
	// refusal's place.
	ForeignRefused Where = "foreign_refused"
)

// Set and Get put a hook on an idem.TestConfig and read it back. Package
// idem installs them (in its init), since only it can reach the unexported
// field; tc is a *idem.TestConfig.
var (
	Set func(tc any, fn Func)
	Get func(tc any) Func
)
