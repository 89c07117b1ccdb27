package idemhttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"reflect"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-idem/idem"
)

// ErrUnauthenticated is what a Config.Scope function returns when the
// request carries no valid credentials. Any error from Scope answers 401
// (unless it is a *Problem, which is answered as it is); returning this one,
// or an error wrapping it, says so plainly.
var ErrUnauthenticated = errors.New("idemhttp: unauthenticated")

// Defaults of [Config].
const (
	DefaultMaxBodyBytes          = 1 << 20
	DefaultUnavailableRetryAfter = 5 * time.Second
	DefaultReconcileRetryAfter   = 60 * time.Second
)

// internalDetail is the detail of ProblemInternal. The cause is logged,
// never sent: it is the server's business.
const internalDetail = "The server could not handle the request. Nothing was recorded for its Idempotency-Key."

// maxPathLength is the longest request path recorded with a key; longer
// paths are cut, since the path is only there for operators.
const maxPathLength = 2048

// Config configures a [Handler]. Scope is required; every other field has
// a documented default.
type Config[In any] struct {
	// Scope derives the key's scope (the tenant or user that owns keys)
	// from the authenticated request. Required: there is no silent global
	// scope, because the same key sent by two callers must be two requests.
	//
	// An error answers 401 Unauthenticated and nothing is recorded: return
	// ErrUnauthenticated (or any error; the text is logged, never sent). A
	// *Problem is written as it is instead, e.g. a 403. An empty scope
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
	// is written as it is.
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
	// the same headers. Set-Cookie, Authorization, hop-by-hop headers and
	// the like are refused by New: they belong to one exchange.
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

// Handler serves one flow over HTTP with the Idempotency-Key contract
// described in the package documentation. It is safe for concurrent use.
type Handler[In any] struct {
	runner *idem.Runner
	flow   *idem.Flow[In]
	cfg    Config[In]
	log    *slog.Logger
	// replay lists the canonical names of the headers sent and replayed,
	// Content-Type first.
	replay []string
}

// New turns a flow into an http.Handler. runner runs it; cfg must set Scope.
func New[In any](runner *idem.Runner, flow *idem.Flow[In], cfg *Config[In]) (*Handler[In], error) {
	if runner == nil {
		return nil, errors.New("idemhttp: New needs a runner")
	}
	if flow == nil {
		return nil, errors.New("idemhttp: New needs a flow")
	}
	if cfg == nil || cfg.Scope == nil {
		return nil, errors.New("idemhttp: Config.Scope is required: derive the key's scope (tenant or user) from the authenticated request; there is no global scope")
	}
	h := &Handler[In]{runner: runner, flow: flow, cfg: *cfg}
	c := &h.cfg
	var errs []error
	switch c.Profile {
	case ProfileIETF, ProfileStripe:
	default:
		errs = append(errs, fmt.Errorf("unknown Profile %d", int(c.Profile)))
	}
	switch {
	case c.MaxBodyBytes == 0:
		c.MaxBodyBytes = DefaultMaxBodyBytes
	case c.MaxBodyBytes < 0:
		errs = append(errs, fmt.Errorf("MaxBodyBytes %d is negative", c.MaxBodyBytes))
	}
	switch {
	case c.MinKeyLength == 0:
		c.MinKeyLength = 1
	case c.MinKeyLength < 0 || c.MinKeyLength > maxKeyLength:
		errs = append(errs, fmt.Errorf("MinKeyLength %d is not between 1 and %d", c.MinKeyLength, maxKeyLength))
	}
	h.replay = []string{"Content-Type"}
	for _, name := range c.ReplayHeaders {
		canonical := http.CanonicalHeaderKey(name)
		switch {
		case !validHeaderName(name):
			errs = append(errs, fmt.Errorf("ReplayHeaders: %q is not a header name", name))
		case neverReplayed[canonical]:
			errs = append(errs, fmt.Errorf("ReplayHeaders: %s is never replayed: it belongs to one exchange, not to the stored response", canonical))
		case !slices.Contains(h.replay, canonical):
			h.replay = append(h.replay, canonical)
		}
	}
	if c.ProblemTypeBase == "" {
		c.ProblemTypeBase = DefaultProblemTypeBase
	} else if _, err := url.Parse(c.ProblemTypeBase); err != nil {
		errs = append(errs, fmt.Errorf("ProblemTypeBase: %w", err))
	}
	if strings.ContainsAny(c.AuthChallenge, "\r\n") {
		errs = append(errs, errors.New("AuthChallenge contains a line break"))
	}
	switch {
	case c.UnavailableRetryAfter == 0:
		c.UnavailableRetryAfter = DefaultUnavailableRetryAfter
	case c.UnavailableRetryAfter < 0:
		errs = append(errs, fmt.Errorf("UnavailableRetryAfter %s is negative", c.UnavailableRetryAfter))
	}
	switch {
	case c.ReconcileRetryAfter == 0:
		c.ReconcileRetryAfter = DefaultReconcileRetryAfter
	case c.ReconcileRetryAfter < 0:
		errs = append(errs, fmt.Errorf("ReconcileRetryAfter %s is negative", c.ReconcileRetryAfter))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("idemhttp: invalid config for flow %q: %w", flow.Name(), errors.Join(errs...))
	}
	c.ReplayHeaders = append([]string(nil), h.replay[1:]...)
	h.log = c.Logger
	if h.log == nil {
		h.log = runner.Config().Logger
	}
	return h, nil
}

// neverReplayed are the headers that must never be sent from a stored
// response: credentials and cookies belong to one exchange, hop-by-hop
// headers to one connection, and the framing headers are computed for each
// response.
var neverReplayed = map[string]bool{
	"Set-Cookie": true, "Set-Cookie2": true, "Authorization": true, "Proxy-Authorization": true,
	"Www-Authenticate": true, "Proxy-Authenticate": true, "Cookie": true,
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Te": true, "Trailer": true,
	"Transfer-Encoding": true, "Upgrade": true, "Content-Length": true, "Date": true,
	"Idempotent-Replayed": true,
}

// ServeHTTP runs the flow for POST and PATCH. Any other method answers 405
// with Allow: POST, PATCH; use [Handler.Middleware] to serve other methods
// of the same path with another handler.
func (h *Handler[In]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !runsFlow(r.Method) {
		p := h.problem(specMethodNotAllowed, fmt.Sprintf("%s is not supported here: use POST or PATCH.", r.Method))
		p.Header = http.Header{"Allow": {"POST, PATCH"}}
		h.writeProblem(w, p)
		return
	}
	h.serveFlow(w, r)
}

// Middleware runs the flow for POST and PATCH and passes every other method
// (GET, HEAD, PUT, DELETE, OPTIONS, ...) to next untouched: those need no
// Idempotency-Key and record nothing.
func (h *Handler[In]) Middleware(next http.Handler) http.Handler {
	if next == nil {
		panic("idemhttp: Middleware needs a next handler")
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runsFlow(r.Method) {
			h.serveFlow(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func runsFlow(method string) bool {
	return method == http.MethodPost || method == http.MethodPatch
}

// Flow returns the flow the handler serves.
func (h *Handler[In]) Flow() *idem.Flow[In] { return h.flow }

// WriteProblem writes p in the handler's profile; see the package-level
// [WriteProblem].
func (h *Handler[In]) WriteProblem(w http.ResponseWriter, p *Problem) {
	WriteProblem(w, h.cfg.Profile, p)
}

// ProblemType returns the type URI of one of the adapter's problems, given
// its name (a Problem* constant).
func (h *Handler[In]) ProblemType(name string) string { return h.cfg.ProblemTypeBase + name }

func (h *Handler[In]) serveFlow(w http.ResponseWriter, r *http.Request) {
	responded := false
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		if v == http.ErrAbortHandler { // a deliberate abort: let net/http drop the connection
			panic(v)
		}
		if responded {
			// The response may have begun: a problem now could only corrupt
			// it. net/http logs the panic and drops the connection, which
			// the client retries.
			panic(v)
		}
		h.log.ErrorContext(r.Context(), "idemhttp: panic while handling a request; nothing was recorded for its key",
			"flow", h.flow.Name(), "panic", v, "stack", string(debug.Stack()))
		h.writeProblem(w, h.problem(specInternal, internalDetail))
	}()

	req, p := h.admit(w, r)
	if p != nil {
		responded = true
		h.writeProblem(w, p)
		return
	}
	// The flow runs to completion even if the client goes away: a
	// half-done multi-phase request would only make its retry resume.
	// Values of the request's context (auth, trace spans) stay visible to
	// the phases.
	out, err := h.runner.Execute(context.WithoutCancel(r.Context()), h.flow, req)
	responded = true
	h.writeOutcome(w, r, req, out, err)
}

// admit turns an HTTP request into a runner request, or into the problem
// that refuses it. Nothing is written to the key store here: all bad input
// is refused before the runner sees it.
func (h *Handler[In]) admit(w http.ResponseWriter, r *http.Request) (idem.Request, *Problem) {
	ctx := r.Context()
	scope, err := h.cfg.Scope(r)
	if err != nil {
		var p *Problem
		if errors.As(err, &p) {
			return idem.Request{}, p
		}
		h.log.DebugContext(ctx, "idemhttp: unauthenticated request", "flow", h.flow.Name(), "err", err)
		return idem.Request{}, h.unauthenticated()
	}
	if scope == "" {
		h.log.WarnContext(ctx, "idemhttp: Config.Scope returned an empty scope without an error; answering 401", "flow", h.flow.Name())
		return idem.Request{}, h.unauthenticated()
	}
	if len(scope) > 255 || !utf8.ValidString(scope) || strings.IndexByte(scope, 0) >= 0 {
		h.log.ErrorContext(ctx, "idemhttp: Config.Scope returned a scope that is not 1-255 bytes of UTF-8 without NUL", "flow", h.flow.Name(), "length", len(scope))
		return idem.Request{}, h.problem(specInternal, internalDetail)
	}

	key, err := ParseKey(r.Header.Values("Idempotency-Key"))
	switch {
	case errors.Is(err, ErrKeyMissing):
		return idem.Request{}, h.problem(specKeyMissing, "This operation is idempotent and requires an Idempotency-Key header: "+
			"send a new unique key (a UUID, say) with each request, and the same key with every retry of it.")
	case err != nil:
		detail := strings.TrimPrefix(err.Error(), ErrKeyMalformed.Error()+": ")
		return idem.Request{}, h.problem(specKeyMalformed, "The Idempotency-Key header is malformed: "+detail+".")
	case len(key) < h.cfg.MinKeyLength:
		return idem.Request{}, h.problem(specKeyMalformed, fmt.Sprintf(
			"The Idempotency-Key header is malformed: key is %d characters long, this endpoint requires at least %d.", len(key), h.cfg.MinKeyLength))
	}

	if p := h.checkContentType(r); p != nil {
		return idem.Request{}, p
	}
	in, p := h.decode(w, r)
	if p != nil {
		return idem.Request{}, p
	}
	if h.cfg.Prepare != nil {
		if err := h.cfg.Prepare(r, &in); err != nil {
			var p *Problem
			if errors.As(err, &p) {
				return idem.Request{}, p
			}
			h.log.ErrorContext(ctx, "idemhttp: Config.Prepare failed; nothing was recorded", "flow", h.flow.Name(), "err", err)
			return idem.Request{}, h.problem(specInternal, internalDetail)
		}
	}
	if h.cfg.Validate != nil {
		if errs := h.cfg.Validate(&in); len(errs) > 0 {
			return idem.Request{}, h.invalidInput(errs...)
		}
	}

	// The escaped path: a decoded one may hold bytes (%00, invalid UTF-8)
	// that a text column refuses, and it is what the client sent.
	path := r.URL.EscapedPath()
	if len(path) > maxPathLength {
		path = path[:maxPathLength]
	}
	return idem.Request{Scope: scope, Key: key, Method: r.Method, Path: path, Params: in}, nil
}

// checkContentType refuses bodies the handler cannot read: a media type
// other than JSON (application/json or any +json type, in UTF-8), or a
// content coding. A request without Content-Type is read as JSON.
func (h *Handler[In]) checkContentType(r *http.Request) *Problem {
	for _, coding := range r.Header.Values("Content-Encoding") {
		for c := range strings.SplitSeq(coding, ",") {
			if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
				p := h.problem(specUnsupportedMediaType, fmt.Sprintf("Content-Encoding %q is not supported: send the body uncompressed.", clip(c)))
				p.Header = http.Header{"Accept-Encoding": {"identity"}}
				return p
			}
		}
	}
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return nil
	}
	mediaType, params, err := mime.ParseMediaType(ct)
	detail := ""
	switch {
	case err != nil:
		detail = fmt.Sprintf("Content-Type %q cannot be parsed: send application/json.", clip(ct))
	case mediaType != "application/json" && !strings.HasSuffix(mediaType, "+json"):
		detail = fmt.Sprintf("Content-Type %s is not supported: send application/json.", clip(mediaType))
	case params["charset"] != "" && !strings.EqualFold(params["charset"], "utf-8"):
		detail = fmt.Sprintf("charset %s is not supported: JSON is sent in UTF-8.", clip(params["charset"]))
	default:
		return nil
	}
	p := h.problem(specUnsupportedMediaType, detail)
	// RFC 5789 and the W3C's Accept-Post tell the client what to send.
	accept := "Accept-Post"
	if r.Method == http.MethodPatch {
		accept = "Accept-Patch"
	}
	p.Header = http.Header{accept: {"application/json"}}
	return p
}

// decode reads the body, within the size limit, as exactly one JSON value
// of type In.
func (h *Handler[In]) decode(w http.ResponseWriter, r *http.Request) (In, *Problem) {
	var in In
	limit := h.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		return in, h.tooLarge()
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return in, h.tooLarge()
		}
		return in, h.problem(specMalformedJSON, "The request body could not be read: "+err.Error()+".")
	}
	return decodeBody[In](h, body)
}

// decodeBody decodes body into an In, mapping each kind of failure to its
// problem: syntax to 400, a value that does not fit In to 422 naming the
// field.
func decodeBody[In any](h *Handler[In], body []byte) (In, *Problem) {
	var in In
	dec := json.NewDecoder(bytes.NewReader(body))
	if !h.cfg.AllowUnknownFields {
		dec.DisallowUnknownFields()
	}
	err := dec.Decode(&in)
	if err == nil {
		if rest := bytes.TrimLeft(body[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
			return in, h.problem(specMalformedJSON, fmt.Sprintf(
				"The request body holds more than one JSON value: unexpected data at byte %d.", len(body)-len(rest)))
		}
		if bytes.Equal(bytes.TrimSpace(body), []byte("null")) {
			return in, h.problem(specInvalidInput, "The request body is null; send a JSON "+jsonKind(reflect.TypeFor[In]())+".")
		}
		return in, nil
	}

	if errors.Is(err, io.EOF) {
		return in, h.problem(specMalformedJSON, "The request body is empty; send a JSON "+jsonKind(reflect.TypeFor[In]())+".")
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return in, h.problem(specMalformedJSON, "The request body ends in the middle of a JSON value.")
	}
	if syntaxErr, ok := errors.AsType[*json.SyntaxError](err); ok {
		return in, h.problem(specMalformedJSON, fmt.Sprintf("The request body is not valid JSON: %s (at byte %d).", syntaxErr.Error(), syntaxErr.Offset))
	}
	if typeErr, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		want := "a " + jsonKind(typeErr.Type)
		if typeErr.Type != nil && isInteger(typeErr.Type.Kind()) && strings.HasPrefix(typeErr.Value, "number") {
			want = "an integer in the range of " + typeErr.Type.Kind().String()
		}
		if typeErr.Field == "" {
			return in, h.problem(specInvalidInput, fmt.Sprintf("The request body must be %s, not %s.", want, describeJSONValue(typeErr.Value)))
		}
		return in, h.invalidInput(FieldError{Field: clip(typeErr.Field), Detail: fmt.Sprintf("must be %s, not %s", want, describeJSONValue(typeErr.Value))})
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		if unquoted, uerr := strconv.Unquote(name); uerr == nil {
			name = unquoted
		}
		return in, h.invalidInput(FieldError{Field: clip(name), Detail: "is not a known field"})
	}
	// An UnmarshalJSON or UnmarshalText method of the input refused its
	// value (a malformed time, say); its message is all there is to say.
	return in, h.problem(specInvalidInput, "The request body is invalid: "+clip(strings.TrimPrefix(err.Error(), "json: "))+".")
}

// jsonKind names the JSON value a Go type decodes from.
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "value"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch k := t.Kind(); {
	case k == reflect.String:
		return "string"
	case k == reflect.Bool:
		return "boolean"
	case isInteger(k), k == reflect.Float32, k == reflect.Float64:
		return "number"
	case k == reflect.Slice, k == reflect.Array:
		return "array"
	case k == reflect.Struct, k == reflect.Map:
		return "object"
	}
	return "value"
}

func isInteger(k reflect.Kind) bool {
	switch k {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return true
	}
	return false
}

// describeJSONValue turns encoding/json's description of a value ("string",
// "number 1.5", "array") into words.
func describeJSONValue(v string) string {
	switch {
	case v == "object" || v == "array":
		return "an " + v
	case v == "bool":
		return "a boolean"
	case strings.HasPrefix(v, "number "):
		return clip(strings.TrimPrefix(v, "number "))
	case v == "":
		return "this value"
	}
	return "a " + v
}

// writeOutcome maps the runner's outcome to the response.
func (h *Handler[In]) writeOutcome(w http.ResponseWriter, r *http.Request, req idem.Request, out *idem.Outcome, err error) {
	ctx := r.Context()
	switch out.Kind {
	case idem.OutcomeExecuted:
		h.writeResponse(w, r, out.Response, false)
	case idem.OutcomeReplayed:
		h.writeResponse(w, r, out.Response, true)
	case idem.OutcomeInProgress:
		p := h.problem(specInProgress, "A request with this Idempotency-Key is still being processed. "+
			"Retry after the time in Retry-After to get its result.")
		p.Header = retryAfter(out.RetryAfter)
		h.writeProblem(w, p)
	case idem.OutcomeLockLost:
		// Another worker took the key over (this one was presumed dead) and
		// owns the request now: for the client it is in progress.
		p := h.problem(specInProgress, "Another attempt of this request took it over while this one ran. "+
			"Retry after the time in Retry-After to get its result.")
		p.Header = retryAfter(time.Second)
		h.writeProblem(w, p)
	case idem.OutcomeTooManyKeys:
		p := h.problem(specTooManyKeys, "Too many requests with new Idempotency-Keys; nothing was recorded for this one. "+
			"Retry it with the same key after the time in Retry-After.")
		p.Header = retryAfter(out.RetryAfter)
		h.writeProblem(w, p)
	case idem.OutcomeMismatch:
		h.writeProblem(w, h.problem(specKeyReused, "This Idempotency-Key was already used for a different request "+
			"(another endpoint or other parameters). Use a new key for a new request, and the same key only to retry the same request."))
	case idem.OutcomeNeedsReconcile:
		p := h.problem(specNeedsReconcile, "This request called an outside system, and whether that call took effect is not known yet. "+
			"The request will not run again until that is settled; retry after the time in Retry-After to get its final result.")
		p.Header = retryAfter(h.cfg.ReconcileRetryAfter)
		h.writeProblem(w, p)
	case idem.OutcomeStoreUnavailable:
		p := h.problem(specStoreUnavailable, "The idempotency key store could not be reached, so the request could not be completed. "+
			"Retry it with the same Idempotency-Key: it resumes where it stopped, and nothing runs twice.")
		p.Header = retryAfter(h.cfg.UnavailableRetryAfter)
		h.writeProblem(w, p)
	case idem.OutcomeFailed:
		h.writeProblem(w, h.problem(specRequestFailed, "The request failed before it completed. Nothing was stored for its Idempotency-Key: "+
			"retry it with the same key and it resumes where it stopped."))
	case idem.OutcomeAbandoned:
		// A test hook simulated a crash. A dead server sends nothing, so the
		// client sees the connection drop, as it would.
		panic(http.ErrAbortHandler)
	case idem.OutcomeInvalid:
		if errors.Is(err, idem.ErrInvalidParams) {
			// Input that decoded but cannot be kept, such as a NUL
			// character in a string.
			h.writeProblem(w, h.problem(specInvalidInput, "The request body is invalid: "+clip(strings.TrimPrefix(err.Error(), idem.ErrInvalidParams.Error()+": "))+"."))
			return
		}
		fallthrough
	default: // a scope the runner refuses, or a kind this adapter does not know
		h.log.ErrorContext(ctx, "idemhttp: the runner refused the request; check Config.Scope and the input type",
			"flow", h.flow.Name(), "outcome", out.Kind, "key", req.Key, "err", err)
		h.writeProblem(w, h.problem(specInternal, internalDetail))
	}
}

// writeResponse writes a flow's response: the stored status and body, and
// of its headers only Content-Type and Config.ReplayHeaders, so the first
// response and every replay are the same.
func (h *Handler[In]) writeResponse(w http.ResponseWriter, r *http.Request, resp *idem.Response, replayed bool) {
	if resp == nil || resp.Status < 200 || resp.Status > 599 {
		status := 0
		if resp != nil {
			status = resp.Status
		}
		h.log.ErrorContext(r.Context(), "idemhttp: the flow's response has an invalid status code", "flow", h.flow.Name(), "status", status)
		h.writeProblem(w, h.problem(specInternal, "The server produced an invalid response."))
		return
	}
	copyAllowed(w.Header(), resp.Header, h.replay)
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	if bodyAllowed(resp.Status) {
		w.Header().Set("Content-Length", strconv.Itoa(len(resp.Body)))
	}
	w.WriteHeader(resp.Status)
	if bodyAllowed(resp.Status) {
		_, _ = w.Write(resp.Body)
	}
}

// copyAllowed copies the allowed headers of src to dst. A phase may have
// built its header map by hand with non-canonical names, so names are
// matched canonically; the canonical spelling wins over others.
func copyAllowed(dst, src http.Header, allowed []string) {
	for _, name := range allowed {
		values, ok := src[name]
		if !ok {
			for k, v := range src {
				if http.CanonicalHeaderKey(k) == name {
					values, ok = v, true
					break
				}
			}
		}
		if ok && len(values) > 0 {
			dst[name] = append([]string(nil), values...)
		}
	}
}

func bodyAllowed(status int) bool {
	return status != http.StatusNoContent && status != http.StatusNotModified
}

// retryAfter renders d as a Retry-After header: whole seconds, rounded up,
// at least one.
func retryAfter(d time.Duration) http.Header {
	secs := max((d+time.Second-1)/time.Second, 1)
	return http.Header{"Retry-After": {strconv.FormatInt(int64(secs), 10)}}
}

func (h *Handler[In]) problem(spec problemSpec, detail string) *Problem {
	return spec.problem(h.cfg.ProblemTypeBase, h.cfg.Profile, detail)
}

func (h *Handler[In]) writeProblem(w http.ResponseWriter, p *Problem) {
	WriteProblem(w, h.cfg.Profile, p)
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
