package idemhttp

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
)

// Profile selects the status codes and error shape of the HTTP contract.
type Profile int

const (
	// ProfileIETF follows draft-ietf-httpapi-idempotency-key-header: a
	// reused key is 422, validation failures are 422. It is the default.
	ProfileIETF Profile = iota

	// ProfileStripe follows Stripe's API: a reused key is 400 with error
	// type idempotency_error, invalid parameters are 400 with
	// invalid_request_error. Problems keep RFC 9457's members and add
	// Stripe's "error" object, so Stripe clients and RFC 9457 clients can
	// both read them.
	ProfileStripe
)

func (p Profile) String() string {
	switch p {
	case ProfileIETF:
		return "ietf"
	case ProfileStripe:
		return "stripe"
	}
	return "Profile(" + strconv.Itoa(int(p)) + ")"
}

// DefaultProblemTypeBase is the default Config.ProblemTypeBase. A problem's
// type URI is the base followed by its name (one of the Problem* constants),
// so the default URIs resolve to the section of docs/http.md that describes
// each problem. The URIs are stable: clients may compare them.
const DefaultProblemTypeBase = "https://github.com/go-idem/idem/blob/main/docs/http.md#"

// Problem type names. The "type" member of a problem is
// Config.ProblemTypeBase followed by one of these; docs/http.md describes
// each with an example response.
const (
	// ProblemKeyMissing: a POST or PATCH without an Idempotency-Key. 400.
	ProblemKeyMissing = "idempotency-key-missing"
	// ProblemKeyMalformed: an Idempotency-Key that is not a valid key
	// (empty, too long or too short, not printable ASCII, a bad sf-string,
	// several keys). 400.
	ProblemKeyMalformed = "idempotency-key-malformed"
	// ProblemKeyReused: the key was first used with another endpoint or
	// other parameters. 422 (IETF), 400 idempotency_error (Stripe).
	ProblemKeyReused = "idempotency-key-reused"
	// ProblemInProgress: another attempt with this key is running. 409 with
	// Retry-After.
	ProblemInProgress = "request-in-progress"
	// ProblemTooManyKeys: the runner's Config.Admit refused to let the
	// caller create another key. Nothing was recorded. 429 with Retry-After.
	ProblemTooManyKeys = "too-many-keys"
	// ProblemNeedsReconcile: the request made a foreign call whose outcome
	// is unknown and waits for reconciliation. 503 with Retry-After.
	ProblemNeedsReconcile = "request-needs-reconcile"
	// ProblemStoreUnavailable: the key store could not be reached; the
	// request was not completed. 503 with Retry-After.
	ProblemStoreUnavailable = "store-unavailable"
	// ProblemRequestFailed: a phase returned an error or panicked. Nothing
	// was stored and the key was released; a retry resumes. 500.
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
	// ProblemInvalidInput: well-formed JSON that does not fit the input: a
	// field of the wrong type, an unknown field, a failed Config.Validate.
	// 422 (IETF), 400 invalid_request_error (Stripe), with the fields at
	// fault in "errors".
	ProblemInvalidInput = "invalid-input"
	// ProblemInternal: the server failed before the request reached its key
	// (a panic in a Config hook, a misconfiguration). Nothing was recorded.
	// 500.
	ProblemInternal = "internal-error"
)

// Stripe error types, the "type" of the Stripe profile's "error" member.
const (
	StripeInvalidRequestError = "invalid_request_error"
	StripeIdempotencyError    = "idempotency_error"
	StripeAPIError            = "api_error"
)

// FieldError is one field at fault in a request body: Field is its JSON
// name (a dotted path for nested fields), Detail says what is wrong, in
// words fit for the client.
type FieldError struct {
	Field  string `json:"field"`
	Detail string `json:"detail"`
}

// Problem is an RFC 9457 problem detail. It is the error format of every
// response the adapter writes itself, and it implements error so that
// Config.Scope and Config.Prepare can return one to answer with it.
// [WriteProblem] writes one for an application's own errors.
type Problem struct {
	// Type is a URI identifying the problem type. Empty means
	// "about:blank": the problem is no more than its status code.
	Type string
	// Title is a short summary of the problem type; empty uses the
	// status code's text.
	Title string
	// Status is the HTTP status code; zero or invalid means 500.
	Status int
	// Detail explains this occurrence, for the client's developer.
	Detail string
	// Instance optionally identifies this occurrence (a URI).
	Instance string
	// Errors lists the fields at fault, written as the "errors" member.
	Errors []FieldError
	// Stripe overrides the "error" member of the Stripe profile. Nil derives
	// it: type api_error for a 5xx status and invalid_request_error
	// otherwise, Detail (or Title) as message, the first field at fault as
	// param.
	Stripe *StripeError
	// Header holds extra response headers, such as Retry-After or Allow.
	Header http.Header
}

// StripeError is the "error" member Stripe clients read.
type StripeError struct {
	Type    string `json:"type"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message"`
	Param   string `json:"param,omitempty"`
}

func (p *Problem) Error() string {
	if p.Detail == "" {
		return fmt.Sprintf("idemhttp: %d %s", p.status(), p.title())
	}
	return fmt.Sprintf("idemhttp: %d %s: %s", p.status(), p.title(), p.Detail)
}

func (p *Problem) status() int {
	if p.Status < 100 || p.Status > 599 {
		return http.StatusInternalServerError
	}
	return p.Status
}

func (p *Problem) title() string {
	if p.Title != "" {
		return p.Title
	}
	return http.StatusText(p.status())
}

// problemBody is the JSON form of a Problem; the member order is fixed, so
// equal problems encode to equal bytes.
type problemBody struct {
	Type     string       `json:"type"`
	Title    string       `json:"title"`
	Status   int          `json:"status"`
	Detail   string       `json:"detail,omitempty"`
	Instance string       `json:"instance,omitempty"`
	Errors   []FieldError `json:"errors,omitempty"`
	Error    *StripeError `json:"error,omitempty"`
}

// encode returns the problem as application/problem+json in profile.
func (p *Problem) encode(profile Profile) []byte {
	body := problemBody{
		Type:     p.Type,
		Title:    p.title(),
		Status:   p.status(),
		Detail:   p.Detail,
		Instance: p.Instance,
		Errors:   p.Errors,
	}
	if body.Type == "" {
		body.Type = "about:blank"
	}
	if profile == ProfileStripe {
		body.Error = p.stripeError()
	}
	out, err := json.Marshal(body)
	if err != nil {
		// Only strings, ints and slices of them: Marshal cannot fail.
		panic(fmt.Sprintf("idemhttp: encode problem: %v", err))
	}
	return out
}

func (p *Problem) stripeError() *StripeError {
	if p.Stripe != nil {
		return p.Stripe
	}
	se := &StripeError{Type: StripeInvalidRequestError, Message: p.Detail}
	if p.status() >= 500 {
		se.Type = StripeAPIError
	}
	if se.Message == "" {
		se.Message = p.title()
	}
	if len(p.Errors) > 0 {
		se.Param = p.Errors[0].Field
	}
	return se
}

// WriteProblem writes p as an application/problem+json response in the
// given profile, with p.Header. Applications use it to answer their own
// errors in the same format as the adapter's.
func WriteProblem(w http.ResponseWriter, profile Profile, p *Problem) {
	writeProblemBody(w, p.status(), p.Header, p.encode(profile))
}

func writeProblemBody(w http.ResponseWriter, status int, extra http.Header, body []byte) {
	h := w.Header()
	for name, values := range extra {
		h[http.CanonicalHeaderKey(name)] = values
	}
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

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
		http.StatusConflict, http.StatusConflict, StripeIdempotencyError, "idempotency_key_in_use"}
	specTooManyKeys = problemSpec{ProblemTooManyKeys, "Too many idempotency keys",
		http.StatusTooManyRequests, http.StatusTooManyRequests, StripeInvalidRequestError, "rate_limit"}
	specNeedsReconcile = problemSpec{ProblemNeedsReconcile, "The outcome of this request is being reconciled",
		http.StatusServiceUnavailable, http.StatusServiceUnavailable, StripeAPIError, ""}
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
	specInvalidInput = problemSpec{ProblemInvalidInput, "Request body is invalid",
		http.StatusUnprocessableEntity, http.StatusBadRequest, StripeInvalidRequestError, ""}
	specInternal = problemSpec{ProblemInternal, "Internal server error",
		http.StatusInternalServerError, http.StatusInternalServerError, StripeAPIError, ""}
)

// problem builds the adapter's problem of kind spec in profile.
func (s problemSpec) problem(base string, profile Profile, detail string) *Problem {
	p := &Problem{Type: base + s.name, Title: s.title, Status: s.status, Detail: detail}
	if profile == ProfileStripe {
		p.Status = s.stripeStatus
		p.Stripe = &StripeError{Type: s.stripeType, Code: s.stripeCode, Message: detail}
	}
	return p
}
