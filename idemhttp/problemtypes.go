package idemhttp

import (
	"fmt"
	"net/http"
	"strings"
)

// ProblemTypeBaseDefault is the default Config.ProblemTypeBase. A problem's
// type URI is the base followed by its name (one of the Problem* constants),
// so the default URIs resolve to the section of docs/http.md that describes
// each problem. The URIs are stable: clients may compare them.
const ProblemTypeBaseDefault = "https://github.com/go-idem/idem/blob/main/docs/http.md#"

// Problem type names. The "type" member of a problem is
// Config.ProblemTypeBase followed by one of these; docs/http.md describes
// each with an example response.
const (
	// ProblemKeyMissing: a POST or PATCH without an Idempotency-Key, or with
	// only empty ones. 400.
	ProblemKeyMissing = "idempotency-key-missing"
	// ProblemKeyMalformed: an Idempotency-Key that is not a valid key
	// (the empty sf-string "", too long or too short, not printable ASCII, a
	// bad sf-string, several keys). 400.
	ProblemKeyMalformed = "idempotency-key-malformed"
	// ProblemKeyReused: the key was first used with another endpoint (method,
	// route or flow) or other parameters. 422 (IETF), 400 idempotency_error (Stripe).
	ProblemKeyReused = "idempotency-key-reused"
	// ProblemInProgress: another attempt with this key is running. 409 with
	// Retry-After; in the Stripe profile, after a wait that ran out
	// (Config.DefaultWait), 429 with error code lock_timeout.
	ProblemInProgress = "request-in-progress"
	// ProblemTooManyKeys: the runner's Config.Admit refused to let the
	// caller create another key. Nothing was recorded. 429 with Retry-After.
	ProblemTooManyKeys = "too-many-keys"
	// ProblemNeedsReconcile: the request made a foreign call whose outcome
	// is unknown and waits for reconciliation. 503 with Retry-After.
	ProblemNeedsReconcile = "request-needs-reconcile"
	// ProblemRequestAbandoned: an operator gave the request up while its
	// outcome was in doubt (idem keys resolve --verdict abandon). It is
	// final: every retry with the key gets it, and nothing runs. 410.
	ProblemRequestAbandoned = "request-abandoned"
	// ProblemRequestNotFound: the status monitor ([Handler.Monitor]) knows
	// no request of the caller's with this Idempotency-Key at this
	// endpoint: never made, made by another caller (scope), or expired.
	// 404.
	ProblemRequestNotFound = "request-not-found"
	// ProblemStoreUnavailable: the key store could not be reached; the
	// request was not completed. 503 with Retry-After.
	ProblemStoreUnavailable = "store-unavailable"
	// ProblemRequestFailed: a phase returned an error or panicked. 500. The
	// phase's own work rolled back, no response was stored and the key was
	// released, but the key stays bound to the request's endpoint and
	// payload and keeps the phases that committed before the failure: a
	// retry with the same body resumes at the failed phase, and the same
	// key with another body is ProblemKeyReused.
	ProblemRequestFailed = "request-failed"
	// ProblemUnauthenticated: Config.Scope found no authenticated caller. 401.
	ProblemUnauthenticated = "unauthenticated"
	// ProblemMethodNotAllowed: the Handler got a method other than POST or
	// PATCH. 405 with Allow.
	ProblemMethodNotAllowed = "method-not-allowed"
	// ProblemUnsupportedMediaType: a body that is not JSON, or is
	// compressed. 415.
	ProblemUnsupportedMediaType = "unsupported-media-type"
	// ProblemBodyTooLarge: a body over Config.MaxBodyBytes. 413.
	ProblemBodyTooLarge = "body-too-large"
	// ProblemMalformedJSON: a body that is not one well-formed JSON value. 400.
	ProblemMalformedJSON = "malformed-json"
	// ProblemMalformedForm: a form body (Stripe profile) that is not a
	// well-formed application/x-www-form-urlencoded body in Stripe's
	// bracket notation (a field given twice, an unclosed bracket, an
	// array index with a gap). 400.
	ProblemMalformedForm = "malformed-form"
	// ProblemInvalidInput: well-formed JSON that does not fit the input: a
	// field of the wrong type, an unknown field, a failed Config.Validate.
	// 422 (IETF), 400 invalid_request_error (Stripe), with the fields at
	// fault in "errors".
	ProblemInvalidInput = "invalid-input"
	// ProblemInternal: the server failed before the request reached its key
	// (a panic in a Config hook, a misconfiguration). Nothing was recorded.
	// 500.
	ProblemInternal = "internal-error"

	// The problems only a [Webhook] writes; docs/webhooks.md describes the
	// contract they belong to.

	// ProblemWebhookSignatureInvalid: WebhookConfig.Verify refused the
	// delivery (a bad or missing signature, a timestamp outside the
	// tolerance). Nothing was recorded and nothing ran. 400.
	ProblemWebhookSignatureInvalid = "webhook-signature-invalid"
	// ProblemWebhookEventInvalid: the delivery's event id or account could
	// not be read (WebhookConfig.EventID or Account failed), or is not a
	// usable key. Nothing was recorded. 400.
	ProblemWebhookEventInvalid = "webhook-event-invalid"
	// ProblemWebhookEventReused: the event id was first delivered with
	// another body. Nothing ran; the first delivery's stored response is
	// untouched. 422.
	ProblemWebhookEventReused = "webhook-event-reused"
	// ProblemWebhookEventInProgress: another delivery of the same event is
	// running, or took this one over. 503 with Retry-After: a provider that
	// redelivers on its own (Stripe) delivers it again later; one that does
	// not (GitHub) shows the delivery as failed, to be resent by hand.
	ProblemWebhookEventInProgress = "webhook-event-in-progress"
)

// Stripe error types, the "type" of the Stripe profile's "error" member.
const (
	StripeInvalidRequestError = "invalid_request_error"
	StripeIdempotencyError    = "idempotency_error"
	StripeAPIError            = "api_error"
)

// CodeRequestUnfinished is the "code" of a request-failed problem (and of
// its Stripe "error" member) for a flow the completer re-drives: the
// request is unfinished, its key keeps it, and the server finishes it
// (idem's completer, where an idem.Maintainer runs) unless a retry with the
// same key does first. Never make it anew under another key: it would
// happen twice.
const CodeRequestUnfinished = "request_unfinished"

// Stripe error codes, the "code" of the Stripe profile's "error" member,
// where the adapter sets one.
const (
	// StripeCodeKeyInUse: request-in-progress answered without a wait, 409.
	StripeCodeKeyInUse = "idempotency_key_in_use"
	// StripeCodeLockTimeout: request-in-progress after a wait that ran
	// out, 429; the Stripe SDKs retry it.
	StripeCodeLockTimeout = "lock_timeout"
)

// problemSpec is one of the adapter's own problem types: its status in each
// profile and what the Stripe profile calls it.
type problemSpec struct {
	name         string
	title        string
	status       int
	stripeStatus int
	stripeType   string
	stripeCode   string
}

var (
	specKeyMissing = problemSpec{ProblemKeyMissing, "Idempotency-Key is missing",
		http.StatusBadRequest, http.StatusBadRequest, StripeInvalidRequestError, ""}
	specKeyMalformed = problemSpec{ProblemKeyMalformed, "Idempotency-Key is malformed",
		http.StatusBadRequest, http.StatusBadRequest, StripeInvalidRequestError, ""}
	specKeyReused = problemSpec{ProblemKeyReused, "Idempotency-Key is already used",
		http.StatusUnprocessableEntity, http.StatusBadRequest, StripeIdempotencyError, ""}
	specInProgress = problemSpec{ProblemInProgress, "A request is outstanding for this Idempotency-Key",
		http.StatusConflict, http.StatusConflict, StripeIdempotencyError, StripeCodeKeyInUse}
	// specInProgressWaited is specInProgress after a wait that ran out
	// (Config.DefaultWait, Prefer: wait): in the Stripe profile a 429
	// lock_timeout, the one Stripe error the Stripe SDKs retry (their
	// 409 idempotency_key_in_use they take as final).
	specInProgressWaited = specInProgress.inStripe(http.StatusTooManyRequests, StripeCodeLockTimeout)
	specTooManyKeys      = problemSpec{ProblemTooManyKeys, "Too many idempotency keys",
		http.StatusTooManyRequests, http.StatusTooManyRequests, StripeInvalidRequestError, "rate_limit"}
	specNeedsReconcile = problemSpec{ProblemNeedsReconcile, "The outcome of this request is being reconciled",
		http.StatusServiceUnavailable, http.StatusServiceUnavailable, StripeAPIError, ""}
	specRequestAbandoned = problemSpec{ProblemRequestAbandoned, "The request was abandoned",
		http.StatusGone, http.StatusGone, StripeIdempotencyError, ""}
	specRequestNotFound = problemSpec{ProblemRequestNotFound, "No such request",
		http.StatusNotFound, http.StatusNotFound, StripeInvalidRequestError, "resource_missing"}
	specStoreUnavailable = problemSpec{ProblemStoreUnavailable, "Idempotency key store unavailable",
		http.StatusServiceUnavailable, http.StatusServiceUnavailable, StripeAPIError, ""}
	specRequestFailed = problemSpec{ProblemRequestFailed, "Request failed before it completed",
		http.StatusInternalServerError, http.StatusInternalServerError, StripeAPIError, ""}
	specUnauthenticated = problemSpec{ProblemUnauthenticated, "Authentication required",
		http.StatusUnauthorized, http.StatusUnauthorized, StripeInvalidRequestError, ""}
	specMethodNotAllowed = problemSpec{ProblemMethodNotAllowed, "Method not allowed",
		http.StatusMethodNotAllowed, http.StatusMethodNotAllowed, StripeInvalidRequestError, ""}
	specUnsupportedMediaType = problemSpec{ProblemUnsupportedMediaType, "Unsupported media type",
		http.StatusUnsupportedMediaType, http.StatusUnsupportedMediaType, StripeInvalidRequestError, ""}
	specBodyTooLarge = problemSpec{ProblemBodyTooLarge, "Request body too large",
		http.StatusRequestEntityTooLarge, http.StatusRequestEntityTooLarge, StripeInvalidRequestError, ""}
	specMalformedJSON = problemSpec{ProblemMalformedJSON, "Request body is not valid JSON",
		http.StatusBadRequest, http.StatusBadRequest, StripeInvalidRequestError, ""}
	specMalformedForm = problemSpec{ProblemMalformedForm, "Request body is not a valid form",
		http.StatusBadRequest, http.StatusBadRequest, StripeInvalidRequestError, ""}
	specInvalidInput = problemSpec{ProblemInvalidInput, "Request body is invalid",
		http.StatusUnprocessableEntity, http.StatusBadRequest, StripeInvalidRequestError, ""}
	specInternal = problemSpec{ProblemInternal, "Internal server error",
		http.StatusInternalServerError, http.StatusInternalServerError, StripeAPIError, ""}
	specWebhookSignatureInvalid = problemSpec{ProblemWebhookSignatureInvalid, "Webhook signature is invalid",
		http.StatusBadRequest, http.StatusBadRequest, StripeInvalidRequestError, ""}
	specWebhookEventInvalid = problemSpec{ProblemWebhookEventInvalid, "Webhook event cannot be identified",
		http.StatusBadRequest, http.StatusBadRequest, StripeInvalidRequestError, ""}
	specWebhookEventReused = problemSpec{ProblemWebhookEventReused, "Webhook event was delivered with another body",
		http.StatusUnprocessableEntity, http.StatusUnprocessableEntity, StripeInvalidRequestError, ""}
	specWebhookEventInProgress = problemSpec{ProblemWebhookEventInProgress, "Webhook event is being processed",
		http.StatusServiceUnavailable, http.StatusServiceUnavailable, StripeAPIError, ""}
)

// inStripe is s with another status and error code in the Stripe profile:
// the same problem type, answered as the Stripe SDKs need to see it.
func (s problemSpec) inStripe(status int, code string) problemSpec {
	s.stripeStatus, s.stripeCode = status, code
	return s
}

// problem builds the adapter's problem of kind spec in profile.
func (s problemSpec) problem(base string, profile Profile, detail string) *Problem {
	p := &Problem{Type: base + s.name, Title: s.title, Status: s.status, Detail: detail}
	if profile == ProfileStripe {
		p.Status = s.stripeStatus
		p.Stripe = &StripeError{Type: s.stripeType, Code: s.stripeCode, Message: detail}
	}
	return p
}

// internalDetail is the detail of ProblemInternal. The cause is logged,
// never sent: it is the server's business.
const internalDetail = "The server could not handle the request. Nothing was recorded for its Idempotency-Key."

func (h *Handler[In]) methodNotAllowed(method string, allow []string) *Problem {
	detail := fmt.Sprintf("%s is not supported here.", method)
	switch len(allow) {
	case 0:
	case 1:
		detail = fmt.Sprintf("%s is not supported here: use %s.", method, allow[0])
	default:
		detail = fmt.Sprintf("%s is not supported here: use %s or %s.", method,
			strings.Join(allow[:len(allow)-1], ", "), allow[len(allow)-1])
	}
	p := h.problem(specMethodNotAllowed, detail)
	p.Header = http.Header{"Allow": {strings.Join(allow, ", ")}}
	return p
}

func (h *Handler[In]) problem(spec problemSpec, detail string) *Problem {
	return spec.problem(h.cfg.ProblemTypeBase, h.cfg.Profile, detail)
}

func (h *Handler[In]) writeProblem(w http.ResponseWriter, p *Problem) {
	WriteProblem(w, h.cfg.Profile, p)
}

// storeUnavailableBeforeDetail is the detail of a 503 from Config.Scope or
// Config.Prepare, before the request reached its key.
const storeUnavailableBeforeDetail = "The database could not be reached, so the request was not run and nothing was recorded. " +
	"Retry it with the same Idempotency-Key."

// storeUnavailable is the 503 with Config.UnavailableRetryAfter.
func (h *Handler[In]) storeUnavailable(detail string) *Problem {
	p := h.problem(specStoreUnavailable, detail)
	p.Header = retryAfter(h.cfg.UnavailableRetryAfter)
	return p
}

func (h *Handler[In]) unauthenticated() *Problem {
	p := h.problem(specUnauthenticated, "This endpoint requires an authenticated caller.")
	if h.cfg.AuthChallenge != "" {
		p.Header = http.Header{"Www-Authenticate": {h.cfg.AuthChallenge}}
	}
	return p
}

func (h *Handler[In]) tooLarge() *Problem {
	return h.problem(specBodyTooLarge, fmt.Sprintf("The request body is larger than the limit of %d bytes.", h.cfg.MaxBodyBytes))
}

// invalidInput is the 422 (Stripe: 400) listing the fields at fault.
func (h *Handler[In]) invalidInput(errs ...FieldError) *Problem {
	var b strings.Builder
	for i, e := range errs {
		if i > 0 {
			b.WriteString("; ")
		}
		if e.Field != "" {
			b.WriteString(e.Field)
			b.WriteString(" ")
		}
		b.WriteString(e.Detail)
	}
	p := h.problem(specInvalidInput, "The request body is invalid: "+b.String()+".")
	p.Errors = append([]FieldError(nil), errs...)
	if p.Stripe != nil {
		p.Stripe.Param = errs[0].Field
	}
	return p
}
