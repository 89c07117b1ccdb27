package idemhttp

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"unicode/utf8"
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
	// Code is a stable, machine-readable reason within the type, written
	// as the "code" member (an RFC 9457 extension member) and, in the
	// Stripe profile, as the code of the "error" member unless Stripe
	// sets one: CodeRequestUnfinished. Empty for most problems.
	Code string
	// Stripe overrides the "error" member of the Stripe profile. Nil derives
	// it: type api_error for a 5xx status and invalid_request_error
	// otherwise, Detail (or Title) as message, the first field at fault as
	// param.
	Stripe *StripeError
	// Header holds extra response headers, such as Retry-After or Allow.
	Header http.Header

	// unknownField marks a body refused only for a member In has no field
	// for: what a request a previous release accepted looks like after a
	// deploy removed or renamed the field, so the handler tries it as a
	// retry of the key its bytes made.
	unknownField bool
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
	Code     string       `json:"code,omitempty"`
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
		Code:     p.Code,
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
	se := &StripeError{Type: StripeInvalidRequestError, Code: p.Code, Message: p.Detail}
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

// maxEcho is the most of a client's value a problem repeats back.
const maxEcho = 64

// clip shortens a value taken from the request before a problem echoes it:
// its first bytes and its length, so that a problem never carries (or
// multiplies) a large input back to the client or into logs.
func clip(s string) string {
	if len(s) <= maxEcho {
		return s
	}
	cut := maxEcho - 16
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", s[:cut], len(s))
}
