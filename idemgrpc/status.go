package idemgrpc

import (
	"errors"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/internal/hooks"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo every status of the
// adapter's own carries.
const ErrorDomain = "idem.go-idem.github.com"

// Reasons of the google.rpc.ErrorInfo in the adapter's own statuses. They are
// stable: clients may branch on them. docs/grpc.md describes each.
const (
	// ReasonKeyMissing: no idempotency key, where one is required.
	// INVALID_ARGUMENT.
	ReasonKeyMissing = "IDEMPOTENCY_KEY_MISSING"
	// ReasonKeyMalformed: a key that is not 1-255 printable ASCII
	// characters (or not a UUID, where UUIDs are required), several keys, or
	// a metadata entry and a request field that disagree. INVALID_ARGUMENT.
	ReasonKeyMalformed = "IDEMPOTENCY_KEY_MALFORMED"
	// ReasonKeyReused: the key was first used for another request (another
	// method, or another message). FAILED_PRECONDITION.
	ReasonKeyReused = "IDEMPOTENCY_KEY_REUSED"
	// ReasonInProgress: another attempt with this key is running. ABORTED
	// with RetryInfo.
	ReasonInProgress = "REQUEST_IN_PROGRESS"
	// ReasonNeedsReconcile: the request made a foreign call whose outcome is
	// unknown and waits for reconciliation. UNAVAILABLE with RetryInfo.
	ReasonNeedsReconcile = "REQUEST_NEEDS_RECONCILE"
	// ReasonRequestAbandoned: an operator gave the request up while its
	// outcome was in doubt (idem keys resolve --verdict abandon); every
	// retry with the key gets it, and nothing runs. FAILED_PRECONDITION.
	ReasonRequestAbandoned = "REQUEST_ABANDONED"
	// ReasonStoreUnavailable: the key store could not be reached; nothing
	// was done, or the request stopped at its last committed phase.
	// UNAVAILABLE with RetryInfo.
	ReasonStoreUnavailable = "STORE_UNAVAILABLE"
	// ReasonRequestFailed: a phase failed; nothing was stored and the key was
	// released, so a retry resumes. UNAVAILABLE with RetryInfo (ABORTED
	// after repeated serialization failures, INTERNAL after a panic).
	ReasonRequestFailed = "REQUEST_FAILED"
	// ReasonUnfinished: the request did not finish before the call's
	// deadline (the key store stalls, or the flow is slow); it runs on.
	// UNAVAILABLE with RetryInfo.
	ReasonUnfinished = "REQUEST_UNFINISHED"
	// ReasonInvalidRequest: the request holds what the key store cannot keep
	// (a NUL character in a string). INVALID_ARGUMENT.
	ReasonInvalidRequest = "INVALID_REQUEST"
	// ReasonInternal: the server failed before the request reached its key
	// (a misconfiguration). Nothing was recorded. INTERNAL.
	ReasonInternal = "INTERNAL"
)

// Default retry delays of [Config].
const (
	DefaultUnavailableRetryDelay = 5 * time.Second
	DefaultReconcileRetryDelay   = 60 * time.Second
	DefaultFailedRetryDelay      = time.Second
	DefaultDeadlineMargin        = 250 * time.Millisecond

	// DefaultWaitTime is Config.DefaultWait's default: long enough for
	// the attempt in flight to end, or for the restarted process of a
	// holder killed mid-request to take its key over, in nearly every
	// case; the call's deadline bounds it anyway (docs/grpc.md, "Waiting
	// for the call in flight", says how it was chosen).
	DefaultWaitTime = 10 * time.Second
)

// PushbackTrailer is the trailer metadata entry that carries a retry delay
// in milliseconds to gRPC's built-in retry policies (gRFC A6), set on every
// status that carries a RetryInfo.
const PushbackTrailer = "grpc-retry-pushback-ms"

// RetryDelay returns the delay a gRPC error's status asks the client to
// wait before retrying (its google.rpc.RetryInfo), and whether it carries
// one: every status of this adapter that invites a retry does (ABORTED,
// UNAVAILABLE). It accepts what a client stub returns, wrapped or not.
// False means no advice: a status without RetryInfo, or an error that is
// not a gRPC status.
//
//	res, err := client.CreateRide(ctx, req)
//	if delay, ok := idemgrpc.RetryDelay(err); ok {
//		time.Sleep(delay) // then retry with the same key and the same message
//	}
func RetryDelay(err error) (time.Duration, bool) {
	if err == nil {
		return 0, false
	}
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	return retryInfo(st)
}

// retryInfo returns the RetryInfo delay of one of the adapter's statuses.
func retryInfo(st *status.Status) (time.Duration, bool) {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// lockLostRetryDelay is the RetryInfo of a request another worker took over:
// it is running, so the client looks again soon.
const lockLostRetryDelay = time.Second

// newStatus builds one of the adapter's statuses: code and message, an
// ErrorInfo with reason, a RetryInfo when retry is positive, and extra
// details.
func newStatus(c codes.Code, reason, msg string, retry time.Duration, extra ...protoadapt.MessageV1) *status.Status {
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}}
	if retry > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	}
	details = append(details, extra...)
	st, err := status.New(c, msg).WithDetails(details...)
	if err != nil {
		// The details are well-formed messages of our own: unreachable.
		return status.New(c, msg)
	}
	return st
}

// delays are the retry delays a handler sends.
type delays struct {
	unavailable, reconcile, failed time.Duration
}

// outcomeStatus maps a runner outcome that carries no response to the
// status the client gets. detail names where the key goes, for the mismatch
// message. ok is false for an outcome with a response (executed, replayed).
func outcomeStatus(out *idem.Outcome, err error, d delays, src keySource) (st *status.Status, ok bool) {
	if errors.Is(err, hooks.ErrSimulatedCrash) {
		// A test hook simulated a crash; a dead server sends nothing, so
		// the nearest is what a client sees of a dropped connection.
		return status.New(codes.Unavailable, "idemgrpc: the server stopped (simulated crash)"), true
	}
	switch out.Kind {
	case idem.OutcomeExecuted, idem.OutcomeReplayed:
		return nil, false
	case idem.OutcomeInProgress:
		return newStatus(codes.Aborted, ReasonInProgress,
			"A request with this idempotency key is still being processed. Retry after the delay in RetryInfo to get its result.",
			max(out.RetryAfter, time.Second)), true
	case idem.OutcomeLockLost:
		// Another worker took the key over (this one was presumed dead)
		// and owns the request now: for the client it is in progress.
		return newStatus(codes.Aborted, ReasonInProgress,
			"Another attempt of this request took it over while this one ran. Retry after the delay in RetryInfo to get its result.",
			lockLostRetryDelay), true
	case idem.OutcomeMismatch:
		return reused(src), true
	case idem.OutcomeNeedsReconcile:
		return newStatus(codes.Unavailable, ReasonNeedsReconcile,
			"This request called an outside system, and whether that call took effect is not known yet. "+
				"The request will not run again until that is settled; retry after the delay in RetryInfo to get its final result.",
			d.reconcile), true
	case idem.OutcomeRequestAbandoned:
		return newStatus(codes.FailedPrecondition, ReasonRequestAbandoned,
			"This request was given up by an operator while its outcome was in doubt, and it will not run. "+
				"Retrying with this idempotency key gets this answer again; to make the request anew, use a new key.",
			0), true
	case idem.OutcomeStoreUnavailable:
		return newStatus(codes.Unavailable, ReasonStoreUnavailable,
			"The idempotency key store could not be reached, so the request could not be completed. "+
				"Retry it with the same idempotency key: it resumes where it stopped, and nothing runs twice.",
			d.unavailable), true
	case idem.OutcomeFailed:
		if _, panicked := errors.AsType[*idem.PanicError](err); panicked || errors.Is(err, idem.ErrUnknownRecoveryPoint) {
			// A bug: retrying is safe, but will likely fail the same way.
			return newStatus(codes.Internal, ReasonRequestFailed,
				"The request failed before it completed. Nothing was stored for its idempotency key: a retry with the same key resumes where it stopped.",
				0), true
		}
		c := codes.Unavailable
		if errors.Is(err, idem.ErrRetriesExhausted) {
			c = codes.Aborted // a concurrency conflict, as ABORTED is defined
		}
		return newStatus(c, ReasonRequestFailed,
			"The request failed before it completed. Nothing was stored for its idempotency key: "+
				"retry it with the same key and it resumes where it stopped.",
			d.failed), true
	case idem.OutcomeCanceled:
		// The runner's caller went away (the handler runs the flow detached
		// from the call's cancellation, so this is a runner shared with
		// code that cancels it). Nothing was stored; CANCELLED is what gRPC
		// answers a call its client gave up on.
		return status.New(codes.Canceled, "idemgrpc: the request was cancelled before it completed; a retry with the same key resumes it"), true
	case idem.OutcomeInvalid:
		if errors.Is(err, idem.ErrInvalidParams) {
			return newStatus(codes.InvalidArgument, ReasonInvalidRequest,
				"The request cannot be stored: strings must not contain the NUL character.", 0), true
		}
	}
	// A scope the runner refuses, or a kind this adapter does not know.
	return internal(), true
}

func reused(src keySource) *status.Status {
	return newStatus(codes.FailedPrecondition, ReasonKeyReused,
		"This idempotency key was already used for a different request (another method or another message). "+
			"Use a new key for a new request, and the same key only to retry the same request.",
		0, &errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{
			Type:        "IDEMPOTENCY_KEY",
			Subject:     src.name(),
			Description: "the key is bound to the request it was first used with",
		}}})
}

func unfinished(retry time.Duration) *status.Status {
	return newStatus(codes.Unavailable, ReasonUnfinished,
		"The request did not finish in time: the idempotency key store or the request's own work is slow. "+
			"It goes on running; retry it with the same key to get its result, and nothing runs twice.",
		retry)
}

func internal() *status.Status {
	return newStatus(codes.Internal, ReasonInternal,
		"The server could not handle the request. Nothing was recorded for its idempotency key.", 0)
}

// keyMalformed is the INVALID_ARGUMENT for a key the client must fix: msg
// says so in words, desc is the BadRequest field violation's description.
func (h *core) keyMalformed(msg, desc string) *status.Status {
	return newStatus(codes.InvalidArgument, ReasonKeyMalformed, msg, 0, h.keyViolation(desc))
}

func (h *core) keyMissing() *status.Status {
	msg := "This method needs an idempotency key in " + h.source.where() +
		": a UUID made up for this request and sent again with every retry of it."
	return newStatus(codes.InvalidArgument, ReasonKeyMissing, msg, 0, h.keyViolation("is required"))
}

func (h *core) keyViolation(desc string) *errdetails.BadRequest {
	return &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{
		Field: h.source.name(), Description: desc,
	}}}
}
