package idem

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/go-idem/idem/idemtype"
	"github.com/jackc/pgx/v5"
)

// Phase is one atomic step of a flow. Its Do function runs inside its
// own transaction (tx); whatever it writes through tx commits together with
// the key's new recovery point, or not at all. A phase may make at most one
// foreign call, through [Attempt.Foreign].
//
// A phase ends by advancing ([Advance]: the recovery point becomes the
// phase's Name and the next phase runs) or by responding ([Respond],
// [RespondJSON]: the response is stored, the key finishes, and every retry
// replays it). The last phase must respond.
type Phase[In any] struct {
	// Name identifies the phase and is the recovery point recorded when it
	// advances: lowercase letters, digits and underscores, starting with a
	// letter, at most 64 characters, unique in the flow, and neither
	// "started" nor "finished". A key's recovery point is stored by name, so
	// rename a phase only by listing its old name in FormerNames (a key at a
	// name the flow no longer knows fails with ErrUnknownRecoveryPoint);
	// docs/flows.md has the rules for every change of a flow.
	Name string

	// FormerNames lists the names the phase had before, oldest first. A key
	// recorded at a former name (its recovery point, or the mark of a
	// not-idempotent call in doubt) resumes as if recorded at Name. The
	// oldest name stays the phase's identity towards providers: its foreign
	// call's downstream key (Attempt.IdempotencyKey) is derived from
	// FormerNames[0], so a request interrupted mid-call before the rename
	// sends the same downstream key after it. Keep the oldest name listed for
	// as long as the flow exists. Former names follow Name's rules and are
	// unique across the flow's names, former names and retired phases.
	FormerNames []string

	// Do does the phase's work.
	Do func(ctx context.Context, tx Tx, a *Attempt[In]) (Result, error)

	// Foreign declares what kind of foreign call the phase makes, if any.
	// The zero value, ForeignIdempotent, suits calls that carry
	// Attempt.IdempotencyKey to a provider that deduplicates on it.
	Foreign ForeignKind

	// Reconcile is required when Foreign is ForeignNotIdempotent and unused
	// otherwise. It runs when a key is found whose foreign call may have
	// happened without the phase committing, and asks the provider what
	// happened. It runs in a transaction of its own, like the phase, so it
	// can make the local writes the phase would have made.
	Reconcile func(ctx context.Context, tx Tx, a *Attempt[In]) (ReconcileVerdict, error)

	// Isolation is the phase transaction's isolation level. Empty uses
	// Config.Isolation (default read committed). Serialization failures and
	// deadlocks are retried either way. A phase that joins the one before it
	// runs in that phase's transaction, so its Isolation must be empty or the
	// same.
	Isolation pgx.TxIsoLevel

	// JoinPrevious runs the phase in the transaction of the phase before it:
	// the two (or more, in a chain) commit together, once, with the
	// recovery point of the last one that ran. It saves a commit and a
	// round trip per request. Default false: every phase commits on its own.
	//
	// Joined phases are one atomic step. A crash before their shared commit
	// loses all their writes and the retry runs them all again, from the
	// first; no recovery point between them is ever recorded. So a
	// transaction of joined phases makes at most one foreign call between
	// them (a second returns ErrSecondForeignCall), and a ForeignNotIdempotent
	// phase is never joined, neither to the phase before it nor by the phase
	// after it: NewFlow refuses both. Join a phase that makes no foreign call
	// (recording a result, enqueueing a job, building the response) to its
	// neighbour. Keep phases apart where a crash between them must not undo
	// the first, and wherever a foreign call names something an earlier
	// phase of the same transaction created: a row inserted there gets a new
	// id on the retry after a crash, and the provider would see the one
	// downstream key sent with another request (the crash kit reports it).
	// A call that names only the request's own input may join.
	// Phases keep their names, checkpoints and observer events: each joined
	// phase reports its own EventPhaseCommitted when the shared commit lands,
	// with the whole transaction's duration. A Tracer sees one phase span per
	// transaction, named after its first phase. Attempt.Key and
	// Attempt.Number describe the shared transaction. The first phase cannot
	// join.
	JoinPrevious bool
}

// ForeignKind classifies a phase's foreign call.
type ForeignKind int

const (
	// ForeignIdempotent: the provider deduplicates on the downstream key
	// (Attempt.IdempotencyKey), so re-running the phase after a crash is safe.
	// This is the default.
	ForeignIdempotent ForeignKind = iota

	// ForeignNotIdempotent: the provider cannot deduplicate (an SMS gateway
	// without idempotency keys, say). Attempt.Foreign durably marks the attempt
	// before calling; if the phase then fails to commit, the key goes to
	// StoredNeedsReconcile and the call is never repeated blindly.
	ForeignNotIdempotent
)

func (k ForeignKind) String() string {
	switch k {
	case ForeignIdempotent:
		return "idempotent"
	case ForeignNotIdempotent:
		return "not_idempotent"
	}
	return "unknown"
}

// Result is how a phase ends. Build one with [Advance], [Respond],
// [RespondJSON] or [RespondJSONWith].
type Result struct {
	response *idemtype.Response
	err      error
}

// Advance ends the phase by committing it and moving to the next phase.
func Advance() Result { return Result{} }

// Respond ends the flow with a response, stored with the phase's commit and
// replayed to every retry: a success, or a permanent failure such as a 402
// card decline. Responding with a 5xx is allowed but is stored like anything
// else; to have the client retry instead, return an error from the phase.
//
// status must be a final HTTP status, 200 to 599; any other fails the phase
// like an error it returned, and nothing is stored.
func Respond(status int, header http.Header, body []byte) Result {
	if err := checkStatus(status); err != nil {
		return Result{err: err}
	}
	return Result{response: &idemtype.Response{Status: status, Header: header.Clone(), Body: append([]byte(nil), body...)}}
}

// RespondJSON is Respond with v encoded as JSON and Content-Type set. An
// encoding error, or a status outside 200-599, fails the phase.
func RespondJSON(status int, v any) Result { return RespondJSONWith(status, nil, v) }

// RespondJSONWith is RespondJSON with headers of the phase's own, such as a
// Location for the resource it created. header is copied; Content-Type is
// application/json unless header sets one. Which headers reach the client
// (and every replay) is the HTTP adapter's choice: idemhttp sends
// Content-Type and the names in its Config.ReplayHeaders.
//
//	return idem.RespondJSONWith(http.StatusCreated, http.Header{"Location": {"/orders/" + id}}, order), nil
func RespondJSONWith(status int, header http.Header, v any) Result {
	if err := checkStatus(status); err != nil {
		return Result{err: err}
	}
	body, err := json.Marshal(v)
	if err != nil {
		return Result{err: err}
	}
	h := header.Clone()
	if h == nil {
		h = http.Header{}
	}
	if h.Get("Content-Type") == "" {
		h.Set("Content-Type", "application/json")
	}
	return Result{response: &idemtype.Response{Status: status, Header: h, Body: body}}
}

// checkStatus refuses what cannot be a request's stored outcome: a 1xx is
// interim, and codes outside 100-599 are not HTTP's.
func checkStatus(status int) error {
	if status < 200 || status > 599 {
		return fmt.Errorf("idem: response status %d is not between 200 and 599", status)
	}
	return nil
}

// Responds reports whether the result ends the flow.
func (r Result) Responds() bool { return r.response != nil }

// ReconcileVerdict is a reconcile hook's verdict. Build one with
// [ReconcileHappened], [ReconcileNotHappened] or [ReconcileUnknown].
type ReconcileVerdict struct {
	verdict verdict
	result  Result
	reason  string
}

type verdict int

const (
	verdictUnknown verdict = iota
	verdictHappened
	verdictNotHappened
)

// ReconcileHappened says the foreign call did happen. result is what the phase
// would have ended with: Advance() (after the hook recorded, through its tx
// and Attempt.SetCheckpoint, what the phase would have recorded) or a response.
// The flow then continues after the phase.
func ReconcileHappened(result Result) ReconcileVerdict {
	return ReconcileVerdict{verdict: verdictHappened, result: result}
}

// ReconcileNotHappened says the foreign call did not happen. The phase runs again
// from the start, which is now safe.
func ReconcileNotHappened() ReconcileVerdict { return ReconcileVerdict{verdict: verdictNotHappened} }

// ReconcileUnknown says the provider cannot tell yet. The key stays in
// StoredNeedsReconcile for a later run or an operator; reason is recorded.
func ReconcileUnknown(reason string) ReconcileVerdict {
	return ReconcileVerdict{verdict: verdictUnknown, reason: reason}
}
