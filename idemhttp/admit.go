package idemhttp

import (
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/go-idem/idem"
)

// maxPathLength is the longest route recorded with a key, as long as the key
// store keeps; a longer one is cut, so routes alike in their first 2048
// bytes are one route.
const maxPathLength = 2048

// admit turns an HTTP request into a runner request, or into the problem
// that refuses it. Nothing is written to the key store here: all bad input
// is refused before the runner sees it. A body that is JSON but does not
// make a valid input (Config.Validate or the decoding refuses it) may still
// be the retry of a request an earlier release accepted: its problem comes
// with a request marked idem.Request.RetryOnly, for the handler to try as
// such before it answers the problem.
func (h *Handler[In]) admit(w http.ResponseWriter, r *http.Request) (idem.Request, *Problem) {
	ctx := r.Context()
	scope, p := h.scope(r)
	if p != nil {
		return idem.Request{}, p
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

	form, p := h.checkContentType(r)
	if p != nil {
		return idem.Request{}, p
	}
	in, body, p := h.decode(w, r, form)
	// The request as a retry of a key made from these very bytes.
	retry := idem.Request{Scope: scope, Key: key, Method: r.Method, Path: route(r), Payload: body, Target: target(r), RetryOnly: true}
	if h.cfg.SharedKeys {
		// Shared keys are fingerprinted over the decoded input: a body
		// that does not decode has nothing to match them with.
		retry = idem.Request{}
	}
	if p != nil {
		// Only a body refused for a field this release does not know is
		// tried as a retry before Prepare has run: its canonical bytes are
		// the ones that made the key, and only a deploy can have made them
		// unreadable. Other refusals (a number spelled 2.0 for an integer
		// field) could share the canonical bytes of another client's
		// request and would replay it without the checks Prepare makes.
		if body != nil && p.unknownField {
			return retry, p
		}
		return idem.Request{}, p
	}
	if h.cfg.Prepare != nil {
		if err := h.cfg.Prepare(r, &in); err != nil {
			var p *Problem
			if errors.As(err, &p) {
				return idem.Request{}, p
			}
			if errors.Is(err, idem.ErrStoreUnavailable) {
				h.log.ErrorContext(ctx, "idemhttp: Config.Prepare could not reach the database; nothing was recorded", "flow", h.flow.Name(), "err", err)
				return idem.Request{}, h.storeUnavailable(storeUnavailableBeforeDetail)
			}
			h.log.ErrorContext(ctx, "idemhttp: Config.Prepare failed; nothing was recorded", "flow", h.flow.Name(), "err", err)
			return idem.Request{}, h.problem(specInternal, internalDetail)
		}
	}
	if h.cfg.Validate != nil {
		if errs := h.cfg.Validate(&in); len(errs) > 0 {
			return retry, h.invalidInput(errs...)
		}
	}

	if h.cfg.SharedKeys {
		// A key shared with other transports is fingerprinted over the
		// decoded input, which every transport builds alike.
		return sharedRequest(scope, key, h.flow.Name(), in), nil
	}
	// The fingerprint is taken over what the client sent (the body and the
	// request target), not over the input decoded and prepared from it, so
	// a retry of the same bytes matches across a deploy that changed the
	// input type or Prepare.
	return idem.Request{Scope: scope, Key: key, Method: r.Method, Path: route(r), Params: in,
		Payload: body, Target: target(r)}, nil
}

// scope is the key's scope for r, from Config.Scope, or the problem that
// refuses r: the flow's requests and its status monitor ([Handler.Monitor])
// derive it alike, so a monitor finds only the caller's own keys.
func (h *Handler[In]) scope(r *http.Request) (string, *Problem) {
	ctx := r.Context()
	scope, err := h.cfg.Scope(r)
	if err != nil {
		var p *Problem
		if errors.As(err, &p) {
			return "", p
		}
		if errors.Is(err, idem.ErrStoreUnavailable) {
			h.log.ErrorContext(ctx, "idemhttp: Config.Scope could not reach the database; nothing was recorded", "flow", h.flow.Name(), "err", err)
			return "", h.storeUnavailable(storeUnavailableBeforeDetail)
		}
		h.log.DebugContext(ctx, "idemhttp: unauthenticated request", "flow", h.flow.Name(), "err", err)
		return "", h.unauthenticated()
	}
	if scope == "" {
		h.log.WarnContext(ctx, "idemhttp: Config.Scope returned an empty scope without an error; answering 401", "flow", h.flow.Name())
		return "", h.unauthenticated()
	}
	if !validScope(scope) {
		h.log.ErrorContext(ctx, "idemhttp: Config.Scope returned a scope that is not 1-255 bytes of UTF-8 without NUL", "flow", h.flow.Name(), "length", len(scope))
		return "", h.problem(specInternal, internalDetail)
	}
	if strings.HasPrefix(scope, WebhookScopePrefix) {
		// Webhook receivers' keys live there: a handler that could make
		// such a scope (a tenant named "webhook:stripe") could take an
		// event id before the provider's delivery of it.
		h.log.ErrorContext(ctx, "idemhttp: Config.Scope returned a scope reserved for webhook receivers; answering 500",
			"flow", h.flow.Name(), "reserved_prefix", WebhookScopePrefix)
		return "", h.problem(specInternal, internalDetail)
	}
	return scope, nil
}

// target is the request target the client sent, escaped path and query,
// which the key's fingerprint binds besides the body: the route a key is
// bound to (a pattern such as "/rides/{id}") leaves out the values Prepare
// may read from the path and the query.
func target(r *http.Request) string {
	t := r.URL.EscapedPath()
	if r.URL.RawQuery != "" || r.URL.ForceQuery {
		t += "?" + r.URL.RawQuery
	}
	return t
}

// sharedRequest is the runner request of an operation served over several
// transports (Config.SharedKeys): the key is bound to the flow, recorded
// as POST <flow name> whatever the route and method, and the request holds
// only what every transport makes, the decoded input, so that the same key
// and input from any of them is one request.
func sharedRequest(scope, key, flow string, in any) idem.Request {
	return idem.Request{Scope: scope, Key: key, Method: http.MethodPost, Path: flow, Params: in}
}

// route names the endpoint a request reached, which the key is bound to
// along with the method: the ServeMux pattern that matched, without its
// method ("/rides/{id}"), or, when no pattern is known (another router, the
// handler alone), the escaped path, which is what the client sent and
// holds no bytes (%00, invalid UTF-8) that a text column refuses.
func route(r *http.Request) string {
	path := r.Pattern
	if path != "" {
		// "[METHOD ][HOST]/[PATH]": the method is stored on its own.
		if i := strings.IndexAny(path, " \t"); i >= 0 {
			path = strings.TrimLeft(path[i+1:], " \t")
		}
	} else {
		path = r.URL.EscapedPath()
	}
	if len(path) > maxPathLength {
		path = path[:maxPathLength]
	}
	return path
}

// checkContentType refuses bodies the handler cannot read: a media type
// other than JSON (application/json or any +json type, in UTF-8), or, in
// the Stripe profile, a form (application/x-www-form-urlencoded, which it
// reports), or a content coding. A request without Content-Type is read as
// JSON.
func (h *Handler[In]) checkContentType(r *http.Request) (form bool, _ *Problem) {
	for _, coding := range r.Header.Values("Content-Encoding") {
		for c := range strings.SplitSeq(coding, ",") {
			if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
				p := h.problem(specUnsupportedMediaType, fmt.Sprintf("Content-Encoding %q is not supported: send the body uncompressed.", clip(c)))
				p.Header = http.Header{"Accept-Encoding": {"identity"}}
				return false, p
			}
		}
	}
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return false, nil
	}
	accepted := "application/json"
	if h.cfg.Profile == ProfileStripe {
		accepted = "application/json, application/x-www-form-urlencoded"
	}
	mediaType, params, err := mime.ParseMediaType(ct)
	form = mediaType == "application/x-www-form-urlencoded" && h.cfg.Profile == ProfileStripe
	detail := ""
	switch {
	case err != nil:
		detail = fmt.Sprintf("Content-Type %q cannot be parsed: send %s.", clip(ct), accepted)
	case mediaType != "application/json" && !strings.HasSuffix(mediaType, "+json") && !form:
		detail = fmt.Sprintf("Content-Type %s is not supported: send %s.", clip(mediaType), accepted)
	case params["charset"] != "" && !strings.EqualFold(params["charset"], "utf-8"):
		detail = fmt.Sprintf("charset %s is not supported: the body is read as UTF-8.", clip(params["charset"]))
	default:
		return form, nil
	}
	p := h.problem(specUnsupportedMediaType, detail)
	// RFC 5789 and the W3C's Accept-Post tell the client what to send.
	accept := "Accept-Post"
	if r.Method == http.MethodPatch {
		accept = "Accept-Patch"
	}
	p.Header = http.Header{accept: {accepted}}
	return false, p
}

// validScope reports whether scope is what the store accepts: 1-255 bytes
// of UTF-8 without NUL (an empty one is refused before this, with its own
// answer).
func validScope(scope string) bool {
	return len(scope) <= 255 && utf8.ValidString(scope) && strings.IndexByte(scope, 0) < 0
}
