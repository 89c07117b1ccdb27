package idemhttp

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/go-idem/idem"
)

// Defaults of [Config], which [New] applies to the fields left zero.
// ProblemTypeBaseDefault is the fifth.
const (
	// MaxBodyBytesDefault is the default Config.MaxBodyBytes: 1 MiB.
	MaxBodyBytesDefault = 1 << 20
	// MinKeyLengthDefault is the default Config.MinKeyLength.
	MinKeyLengthDefault = 1
	// UnavailableRetryAfterDefault is the default Config.UnavailableRetryAfter.
	UnavailableRetryAfterDefault = 5 * time.Second
	// ReconcileRetryAfterDefault is the default Config.ReconcileRetryAfter.
	ReconcileRetryAfterDefault = 60 * time.Second
	// DefaultWaitTime is the default Config.DefaultWait: 5 s, longer
	// than the requests of a flow that calls a provider take when they
	// are not failing (docs/http.md, "Waiting for the request in flight",
	// has the measurement), and well below the write timeouts of servers
	// and proxies.
	DefaultWaitTime = 5 * time.Second
	// AsyncRetryAfterDefault is the default Config.AsyncRetryAfter.
	AsyncRetryAfterDefault = time.Second
)

// InProgressAnswer is how a Handler answers a request whose key another
// attempt is running (Config.InProgress).
type InProgressAnswer int

const (
	// InProgressConflict answers 409 Conflict (problem
	// request-in-progress) with Retry-After, as the IETF draft and
	// Stripe do: the default.
	InProgressConflict InProgressAnswer = iota
	// InProgressAccepted answers 202 Accepted with Retry-After, a
	// [RequestStatus] body and, where Config.MonitorURL is set, the
	// status monitor's Location: the request is being processed, and a
	// client polls (or retries) for its answer. Stock clients take a 2xx
	// as the answer itself; use it for clients that know the 202.
	InProgressAccepted
)

// Config configures a [Handler]. Scope is required; every other field
// names its default, which [New] applies when the field is left zero.
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
	// A scope that starts with WebhookScopePrefix ("webhook:") is reserved
	// for webhook receivers ([NewWebhook]): it answers 500 internal-error,
	// logged, and nothing is recorded. Prefix tenant names ("tenant:acme")
	// so that none can take that form.
	Scope func(r *http.Request) (string, error)

	// Prepare sets server-derived fields of the decoded input (the user id
	// from auth, say) after decoding and before validation. Default none.
	// It must overwrite such fields, so that a client cannot set them
	// through the body, and keep them serialisable: the input is stored as
	// JSON to re-drive the request without the client. The key's
	// fingerprint is taken over the body and the request target as the
	// client sent them, not over the prepared input, so a release that
	// changes what Prepare fills in does not turn retries into reused
	// keys; what Prepare derives from elsewhere (a header) is not compared
	// between attempts.
	//
	// Never put per-attempt data (client IP, time, a trace id) in the input:
	// a retry that resumes a request would see other values than its first
	// attempt did. Phases get such data from the request's context, which the
	// handler passes through (its values, not its cancellation or
	// deadline). The completer re-drives a request whose client gave up
	// without that context, so a phase must not depend on it: what it cannot
	// do without (the tenant, say) belongs in the key's scope or in the
	// input.
	//
	// An error answers 500 (ProblemInternal), unless it is a *Problem, which
	// is written as it is, or wraps idem.ErrStoreUnavailable, which answers
	// 503 ProblemStoreUnavailable as for Scope.
	Prepare func(r *http.Request, in *In) error

	// Validate checks the prepared input. Field errors answer 422 (400 in
	// the Stripe profile) listing them, before any key is written. Default
	// none.
	Validate func(in *In) []FieldError

	// Profile selects the IETF or Stripe status codes and error shape.
	// Default ProfileIETF.
	Profile Profile

	// MaxBodyBytes limits the request body; a larger one answers 413.
	// Default MaxBodyBytesDefault, 1 MiB.
	MaxBodyBytes int64

	// MinKeyLength is the shortest Idempotency-Key accepted, 1-255.
	// Default MinKeyLengthDefault, 1. Raise it (to 16, say) to refuse keys too short to be
	// unique.
	MinKeyLength int

	// ReplayHeaders names response headers that are sent, and replayed,
	// besides Content-Type (e.g. Location). Every other header a phase sets
	// is dropped, from the first response as from replays, so both carry
	// the same headers. Headers that belong to one exchange (Set-Cookie,
	// Authorization, hop-by-hop headers and the like: those for which
	// idem.ReplayableHeader is false) are refused by New. Default none:
	// Content-Type alone.
	ReplayHeaders []string

	// AllowUnknownFields makes the decoder ignore body members that the
	// input type does not have. Default false: they answer 422 naming the
	// member, so a typo ("amout") is reported instead of silently ignored.
	// Ignored members are still part of the fingerprint, which is taken
	// over the body as sent.
	AllowUnknownFields bool

	// SharedKeys binds the handler's keys to its flow rather than to its
	// route and method: every handler of the flow that sets it, over HTTP
	// or over gRPC (idemgrpc.Config.SharedKeys), serves one operation with
	// one key space, so a request sent over one transport and retried over
	// the other with the same key (and scope) gets the stored response
	// rather than a second execution. The key is recorded as POST <flow
	// name>. The fingerprint is then taken over the decoded input (what
	// every transport makes of its request), so the flow's answer should
	// be one every transport can render: JSON (idem.RespondJSON), which
	// idemgrpc decodes into the method's response message. docs/http.md,
	// "One operation, two transports", shows the whole pattern. Default
	// false: the key is bound to the route and method.
	SharedKeys bool

	// ProblemTypeBase prefixes the names of problem types (the Problem*
	// constants) to make their type URIs. Default ProblemTypeBaseDefault,
	// which leads to docs/http.md.
	ProblemTypeBase string

	// AuthChallenge is sent as WWW-Authenticate with a 401, as RFC 9110
	// asks (e.g. `Bearer realm="rides"`). Default none.
	AuthChallenge string

	// UnavailableRetryAfter is the Retry-After sent when the key store is
	// unreachable, rounded up to whole seconds. Default
	// UnavailableRetryAfterDefault, 5s.
	UnavailableRetryAfter time.Duration

	// ReconcileRetryAfter is the Retry-After sent for a key that waits for
	// reconciliation, rounded up to whole seconds. Default
	// ReconcileRetryAfterDefault, 60s.
	ReconcileRetryAfter time.Duration

	// MaxWait is the longest a request waits for another attempt of its key
	// that is in flight, when it asks to with the RFC 7240 preference
	// "Prefer: wait=N" (N in seconds; the smaller of the two counts): it
	// then gets that attempt's stored response, replayed as any replay is
	// (Idempotent-Replayed: true), or what a retry arriving when the
	// attempt ended gets (503 for a key parked for reconciliation; the
	// request itself, resumed, when the attempt failed and released the
	// key or its process died), or the 409 it gets today when the attempt
	// is not over in time. A request that waited is answered with
	// Preference-Applied: wait=N, N the whole seconds granted, rounded
	// down (whole seconds are what a client can ask for). The wait holds
	// no database connection (idem.Request.Wait), and ends when the client
	// goes away (a flow the request took over runs on). Prefer is read
	// only for a request that is to run, within its first 4096 bytes and
	// 32 preferences. It also caps DefaultWait. Keep it below the server's
	// WriteTimeout. Default 0: the longest wait is DefaultWait, so
	// "Prefer: wait=N" is honoured up to DefaultWait (and wait=0 still
	// answers 409 at once); with DefaultWait off as well, Prefer: wait is
	// ignored and a key in flight answers 409 at once.
	MaxWait time.Duration

	// DefaultWait is how long a request that sends no "Prefer: wait"
	// waits for another attempt of its key in flight, as if it had sent
	// "Prefer: wait" for that long (see MaxWait for what it then gets).
	// Stock clients (the Stripe SDKs, go-retryablehttp) send no Prefer and
	// take a 409 as final, while the attempt in flight goes on to succeed:
	// waiting turns their retry's 409 into the request's answer; at most
	// MaxWait, where MaxWait is set. A request that sends "Prefer: wait=N"
	// waits N seconds instead (at most MaxWait, or DefaultWait where
	// MaxWait is 0), so "Prefer: wait=0" opts out. When the
	// wait runs out, the Stripe profile answers 429 with error code
	// lock_timeout, which the Stripe SDKs retry, instead of the 409
	// idempotency_key_in_use they take as final; the IETF profile answers
	// its 409. Preference-Applied is sent only to a request that sent
	// Prefer. Keep it below the server's WriteTimeout. Default
	// DefaultWaitTime, 5 s; negative: no wait, a key in flight answers
	// at once.
	DefaultWait time.Duration

	// RespondAsync honours the RFC 7240 preference "Prefer:
	// respond-async": once such a request holds its key, it is answered
	// 202 Accepted with Preference-Applied: respond-async, Retry-After
	// (AsyncRetryAfter), the status monitor's Location (MonitorURL) and a
	// [RequestStatus] body, and its flow goes on in the process without
	// its client. A retry of the key while it runs gets the same 202; once
	// it finished, the stored response, as any retry does. With "Prefer:
	// respond-async, wait=N" a request that starts the flow is answered
	// its response when the flow ends within N seconds (at most MaxWait,
	// or DefaultWait), 202 otherwise; one whose key another attempt runs
	// gets the 202 at once. Such runs count against Detached: beyond its limit the
	// request runs while its client waits, as without the preference, and
	// its answer carries "Idem-Async: declined; reason=busy" (a retry of
	// a key still running gets its 202 all the same). A process
	// that dies leaves its runs to the completer (idem.Maintainer), so
	// New refuses it for a flow the completer does not re-drive
	// (idem.FlowConfig.NoRedrive), and requires MonitorURL. Default false:
	// the preference is ignored. docs/http.md, "Long requests", has the
	// client's side.
	RespondAsync bool

	// MonitorURL is the URL (an absolute path, or an absolute URL) at
	// which the application serves this handler's status monitor
	// ([Handler.Monitor]), behind the same authentication as the flow.
	// A 202 answer's Location is MonitorURL with the query parameter key
	// set to the request's Idempotency-Key. Required with RespondAsync;
	// default none.
	MonitorURL string

	// InProgress is the answer to a request whose key another attempt is
	// running, after any wait (DefaultWait, Prefer: wait): 409 Conflict
	// (InProgressConflict, the default) or 202 Accepted
	// (InProgressAccepted). A request that asked "Prefer: respond-async"
	// of a handler with RespondAsync gets the 202 either way.
	InProgress InProgressAnswer

	// AsyncRetryAfter is the Retry-After of a 202 Accepted answer, from
	// the flow or from the status monitor, rounded up to whole seconds:
	// how often a client polls. Default AsyncRetryAfterDefault, 1 s.
	AsyncRetryAfter time.Duration

	// ShowRecoveryPoint shows the recovery point of a running request
	// (the name of its last committed phase, "started" before the first)
	// in the recovery_point member of a 202's [RequestStatus] body. Phase
	// names are the flow's own vocabulary; show them only where they are
	// fit for clients. Default false.
	ShowRecoveryPoint bool

	// Detached bounds the flows that run without their client: requests
	// answered 202 (RespondAsync) and requests whose client went away,
	// which run to completion. Share one [DetachedRuns] between every
	// handler of the process. Default nil: DefaultDetachedRuns, shared by
	// every handler that leaves it nil.
	Detached *DetachedRuns

	// Logger receives the handler's logs (panics, misconfiguration; client
	// errors at debug level). Default: the runner's logger.
	Logger *slog.Logger
}

// apply checks c and sets the defaults of the fields left zero. It returns
// the canonical names of the headers sent and replayed, Content-Type first.
func (c *Config[In]) apply() (replay []string, err error) {
	var errs []error
	switch c.Profile {
	case ProfileIETF, ProfileStripe:
	default:
		errs = append(errs, fmt.Errorf("unknown Profile %d", int(c.Profile)))
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxBodyBytes %d is negative", c.MaxBodyBytes))
	}
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, MaxBodyBytesDefault)
	c.MinKeyLength = cmp.Or(c.MinKeyLength, MinKeyLengthDefault)
	if c.MinKeyLength < 1 || c.MinKeyLength > maxKeyLength {
		errs = append(errs, fmt.Errorf("MinKeyLength %d is not between 1 and %d", c.MinKeyLength, maxKeyLength))
	}
	replay = []string{"Content-Type"}
	for _, name := range c.ReplayHeaders {
		canonical := http.CanonicalHeaderKey(name)
		switch {
		case !validHeaderName(name):
			errs = append(errs, fmt.Errorf("ReplayHeaders: %q is not a header name", name))
		case !idem.ReplayableHeader(canonical):
			errs = append(errs, fmt.Errorf("ReplayHeaders: %s is never replayed: it belongs to one exchange, not to the stored response", canonical))
		case !slices.Contains(replay, canonical):
			replay = append(replay, canonical)
		}
	}
	c.ProblemTypeBase = cmp.Or(c.ProblemTypeBase, ProblemTypeBaseDefault)
	if _, err := url.Parse(c.ProblemTypeBase); err != nil {
		errs = append(errs, fmt.Errorf("ProblemTypeBase: %w", err))
	}
	if strings.ContainsAny(c.AuthChallenge, "\r\n") {
		errs = append(errs, errors.New("AuthChallenge contains a line break"))
	}
	if c.UnavailableRetryAfter < 0 {
		errs = append(errs, fmt.Errorf("UnavailableRetryAfter %s is negative", c.UnavailableRetryAfter))
	}
	c.UnavailableRetryAfter = wholeSeconds(cmp.Or(c.UnavailableRetryAfter, UnavailableRetryAfterDefault))
	if c.ReconcileRetryAfter < 0 {
		errs = append(errs, fmt.Errorf("ReconcileRetryAfter %s is negative", c.ReconcileRetryAfter))
	}
	c.ReconcileRetryAfter = wholeSeconds(cmp.Or(c.ReconcileRetryAfter, ReconcileRetryAfterDefault))
	if c.MaxWait < 0 {
		errs = append(errs, fmt.Errorf("MaxWait %s is negative", c.MaxWait))
	}
	c.DefaultWait = cmp.Or(c.DefaultWait, DefaultWaitTime)
	if c.DefaultWait < 0 {
		c.DefaultWait = 0
	}
	errs = append(errs, c.applyAsync()...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	c.ReplayHeaders = slices.Clone(replay[1:])
	return replay, nil
}

// wholeSeconds rounds a positive d up to whole seconds, as Retry-After
// sends it: the one rounding a configured Retry-After gets.
func wholeSeconds(d time.Duration) time.Duration {
	return (d + time.Second - 1) / time.Second * time.Second
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

// applyAsync checks the fields of long requests (RespondAsync and its
// kin) and sets their defaults.
func (c *Config[In]) applyAsync() (errs []error) {
	switch c.InProgress {
	case InProgressConflict, InProgressAccepted:
	default:
		errs = append(errs, fmt.Errorf("unknown InProgress %d", int(c.InProgress)))
	}
	if c.AsyncRetryAfter < 0 {
		errs = append(errs, fmt.Errorf("AsyncRetryAfter %s is negative", c.AsyncRetryAfter))
	}
	c.AsyncRetryAfter = wholeSeconds(cmp.Or(c.AsyncRetryAfter, AsyncRetryAfterDefault))
	if c.MonitorURL != "" {
		u, err := url.Parse(c.MonitorURL)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("MonitorURL: %w", err))
		case u.Fragment != "" || (!u.IsAbs() && !strings.HasPrefix(u.Path, "/")):
			errs = append(errs, fmt.Errorf("MonitorURL %q is neither an absolute path nor an absolute URL without a fragment", c.MonitorURL))
		}
	}
	if c.RespondAsync && c.MonitorURL == "" {
		errs = append(errs, errors.New("RespondAsync needs MonitorURL: a 202 Accepted tells the client where to learn the answer"))
	}
	if c.Detached == nil {
		c.Detached = DefaultDetachedRuns
	}
	return errs
}
