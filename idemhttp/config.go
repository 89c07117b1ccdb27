package idemhttp

import (
	"log/slog"
	"net/http"
	"time"
)

// Defaults of [Config].
const (
	DefaultMaxBodyBytes          = 1 << 20
	DefaultUnavailableRetryAfter = 5 * time.Second
	DefaultReconcileRetryAfter   = 60 * time.Second
)

// Config configures a [Handler]. Scope is required; every other field has
// a documented default.
type Config[In any] struct {
	// Scope derives the key's scope (the tenant or user that owns keys)
	// from the authenticated request. Required: there is no silent global
	// scope, because the same key sent by two callers must be two requests.
	//
	// An error answers 401 Unauthenticated and nothing is recorded: return
	// ErrUnauthenticated (or any error; the text is logged, never sent). A
	// *Problem is written as it is instead, e.g. a 403. An error wrapping
	// idem.ErrStoreUnavailable (a session or user lookup in the database
	// that holds the keys, which did not answer) answers the adapter's own
	// 503 ProblemStoreUnavailable with UnavailableRetryAfter. An empty scope
	// without an error is treated as unauthenticated. A scope is 1-255 bytes.
	Scope func(r *http.Request) (string, error)

	// Prepare sets server-derived fields of the decoded input (the user id
	// from auth, say) after decoding and before validation and
	// fingerprinting. Optional. It must overwrite such fields, so that a
	// client cannot set them through the body, and keep them serialisable:
	// the input is stored as JSON to fingerprint it and to re-drive the
	// request without the client.
	//
	// Never put per-attempt data (client IP, time, a trace id) in the input:
	// it is fingerprinted, so a retry would no longer match its first
	// attempt. Phases get such data from the request's context, which the
	// handler passes through.
	//
	// An error answers 500 (ProblemInternal), unless it is a *Problem, which
	// is written as it is, or wraps idem.ErrStoreUnavailable, which answers
	// 503 ProblemStoreUnavailable as for Scope.
	Prepare func(r *http.Request, in *In) error

	// Validate checks the prepared input. Field errors answer 422 (400 in
	// the Stripe profile) listing them, before any key is written. Optional.
	Validate func(in *In) []FieldError

	// Profile selects the IETF (default) or Stripe status codes and error
	// shape.
	Profile Profile

	// MaxBodyBytes limits the request body; a larger one answers 413.
	// Default 1 MiB (DefaultMaxBodyBytes).
	MaxBodyBytes int64

	// MinKeyLength is the shortest Idempotency-Key accepted, 1-255.
	// Default 1. Raise it (to 16, say) to refuse keys too short to be
	// unique.
	MinKeyLength int

	// ReplayHeaders names response headers that are sent, and replayed,
	// besides Content-Type (e.g. Location). Every other header a phase sets
	// is dropped, from the first response as from replays, so both carry
	// the same headers. Headers that belong to one exchange (Set-Cookie,
	// Authorization, hop-by-hop headers and the like: those for which
	// idem.ReplayableHeader is false) are refused by New.
	ReplayHeaders []string

	// AllowUnknownFields makes the decoder ignore body members that the
	// input type does not have. By default they answer 422 naming the
	// member, so a typo ("amout") is reported instead of silently ignored.
	// Ignored members are not part of the fingerprint.
	AllowUnknownFields bool

	// ProblemTypeBase prefixes the names of problem types (the Problem*
	// constants) to make their type URIs. Default DefaultProblemTypeBase.
	ProblemTypeBase string

	// AuthChallenge is sent as WWW-Authenticate with a 401, as RFC 9110
	// asks (e.g. `Bearer realm="rides"`). Default none.
	AuthChallenge string

	// UnavailableRetryAfter is the Retry-After sent when the key store is
	// unreachable. Default 5s.
	UnavailableRetryAfter time.Duration

	// ReconcileRetryAfter is the Retry-After sent for a key that waits for
	// reconciliation. Default 60s.
	ReconcileRetryAfter time.Duration

	// Logger receives the handler's logs (panics, misconfiguration; client
	// errors at debug level). Default: the runner's logger.
	Logger *slog.Logger
}

// validHeaderName reports whether name is an RFC 9110 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := range len(name) {
		if !isTChar(name[i]) {
			return false
		}
	}
	return true
}
