package idemtest

import (
	"context"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/internal/hooks"
)

// A runner's test hook: a function the runner calls at every point of a
// phase's life (HookPoint), which can pause it there, fail the phase, or
// crash the runner (ErrSimulatedCrash). Explore and the fault kit set their
// own; WithHook sets one by hand. Package idem does not export it: only
// tests reach it, through this package.
type (
	// HookPoint says where a hook is being called. Its fields: Where (a
	// HookWhere), Flow, Phase and Attempt; Key, the *idemtype.KeyRecord as
	// the runner knows it there; ForeignKind, the phase's declared
	// idem.ForeignKind as an int (compare with
	// idem.ForeignKind(at.ForeignKind) == idem.ForeignNotIdempotent);
	// Foreign and DownstreamKey, the foreign call's name and the key it
	// receives, at HookBeforeForeign and HookAfterForeign; Err, the refusal
	// at HookForeignRefused.
	HookPoint = hooks.Point
	// HookWhere names a point in a phase's life.
	HookWhere = hooks.Where
)

// The points of a phase's life, in order. Phases joined by
// Phase.JoinPrevious pass them too, around the transaction they share.
const (
	// HookPhaseStart: the phase's transaction has begun; its body has not
	// run.
	HookPhaseStart = hooks.PhaseStart
	// HookBeforeForeign: the phase is about to make its foreign call (a
	// not-idempotent phase has recorded its mark); the call has not been
	// made.
	HookBeforeForeign = hooks.BeforeForeign
	// HookAfterForeign: the foreign call has returned; the phase has not
	// committed.
	HookAfterForeign = hooks.AfterForeign
	// HookBeforeCommit: the phase's body returned; the guarded commit has
	// not been sent.
	HookBeforeCommit = hooks.BeforeCommit
	// HookAfterCommit: the phase committed; the caller has not been told.
	HookAfterCommit = hooks.AfterCommit
	// HookForeignRefused: the runner refused a second foreign call in the
	// phase's transaction (idem.ErrSecondForeignCall); the call was not
	// made.
	HookForeignRefused = hooks.ForeignRefused
)

// ErrSimulatedCrash is what a hook returns to make the runner behave as if
// its process died at that point: the open transaction is rolled back and
// nothing is released. The runner returns it (errors.Is), and idemhttp and
// idemgrpc answer as a dead server would.
var ErrSimulatedCrash = hooks.ErrSimulatedCrash

// WithHook returns tc with fn as the runner's test hook: set it as a
// Config's Test. A hook returning another error than ErrSimulatedCrash
// fails the phase as if the phase had returned it (a serialization failure
// is retried), except at HookAfterCommit, where it plays a lost commit
// acknowledgement: the phase did commit, the runner sees the commit fail,
// re-reads the key under its fence, finds the commit landed and goes on.
func WithHook(tc idem.TestConfig, fn func(ctx context.Context, at HookPoint) error) idem.TestConfig {
	hooks.Set(&tc, fn)
	return tc
}

// hookOf is the hook WithHook set on tc; nil if none.
func hookOf(tc idem.TestConfig) hooks.Func {
	return hooks.Get(&tc)
}
