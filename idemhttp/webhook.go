package idemhttp

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/go-idem/idem"
)

// WebhookScopePrefix starts the scope of every key a [Webhook] makes:
// "webhook:" + Provider, or "webhook:" + Provider + "/" + account. A
// [Handler] whose Config.Scope returns a scope with this prefix is refused
// (500 internal-error), and so is idemgrpc's, so no other handler on the
// store can create a webhook event's key before its delivery does.
const WebhookScopePrefix = "webhook:"

// RedeliveryWindowDefault is the default WebhookConfig.RedeliveryWindow:
// 72 hours, the longest of the common providers' (Stripe retries a
// delivery for up to three days).
const RedeliveryWindowDefault = 72 * time.Hour

// ErrWebhookValueMissing is what a [WebhookValue] made by [HeaderValue] or
// [JSONValue] returns (wrapped) when the delivery does not carry its
// value. [Optional] turns it into a fallback.
var ErrWebhookValueMissing = errors.New("idemhttp: webhook value missing")

// WebhookValue reads one value of a webhook delivery, its event id or its
// account, from the request and its raw body. [HeaderValue] and
// [JSONValue] make the usual ones.
type WebhookValue func(r *http.Request, body []byte) (string, error)

// HeaderValue reads the value of the request header name. A missing or
// empty header is ErrWebhookValueMissing. Use it only for a header the
// provider's signature covers: any other (GitHub's X-GitHub-Delivery, say)
// is the sender's to choose, and a captured delivery sent again under a
// fresh value is a new event.
func HeaderValue(name string) WebhookValue {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request, _ []byte) (string, error) {
		v := strings.TrimSpace(r.Header.Get(name))
		if v == "" {
			return "", fmt.Errorf("%w: no %s header", ErrWebhookValueMissing, name)
		}
		return v, nil
	}
}

// JSONValue reads the string member at path of the JSON object the body
// is: JSONValue("id") is Stripe's event id, JSONValue("data", "object",
// "id") a member of a nested object. A member that is absent or null is
// ErrWebhookValueMissing; one that is not a string, or a body that is not
// a JSON object, is another error.
func JSONValue(path ...string) WebhookValue {
	if len(path) == 0 {
		panic("idemhttp: JSONValue needs a path")
	}
	path = append([]string(nil), path...)
	where := strings.Join(path, ".")
	return func(_ *http.Request, body []byte) (string, error) {
		raw := json.RawMessage(body)
		for _, name := range path {
			var object map[string]json.RawMessage
			if err := json.Unmarshal(raw, &object); err != nil {
				return "", fmt.Errorf("reading %s: the body is not a JSON object there", where)
			}
			var ok bool
			if raw, ok = object[name]; !ok {
				return "", fmt.Errorf("%w: the body has no member %s", ErrWebhookValueMissing, where)
			}
		}
		if string(raw) == "null" {
			return "", fmt.Errorf("%w: member %s of the body is null", ErrWebhookValueMissing, where)
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("member %s of the body is not a string", where)
		}
		if s == "" {
			return "", fmt.Errorf("%w: member %s of the body is empty", ErrWebhookValueMissing, where)
		}
		return s, nil
	}
}

// Optional reads v, and answers fallback where v reports
// ErrWebhookValueMissing: Optional(JSONValue("account"), "") is the
// account of a Stripe Connect event, and none for the platform's own
// events, which carry no "account" member.
func Optional(v WebhookValue, fallback string) WebhookValue {
	return func(r *http.Request, body []byte) (string, error) {
		s, err := v(r, body)
		if errors.Is(err, ErrWebhookValueMissing) {
			return fallback, nil
		}
		return s, err
	}
}

// WebhookConfig configures a [Webhook]. Provider, Verify and EventID are
// required; every other field names its default, which [NewWebhook]
// applies when the field is left zero. docs/webhooks.md describes the
// contract.
type WebhookConfig struct {
	// Provider names the sender ("stripe", "github"): 1-64 characters of
	// a-z, 0-9, '.', '_' and '-'. Every key's scope is WebhookScopePrefix
	// + Provider (+ "/" + account), so two providers' event ids never
	// collide, nor a webhook's with another handler's keys. Required.
	Provider string

	// Account derives the provider account the event belongs to (a
	// Stripe Connect account, a GitHub installation) from the delivery;
	// the key's scope is Provider/account, so the same event id from two
	// accounts is two events. An empty account, or no Account, makes the
	// scope Provider alone. An error answers 400
	// ProblemWebhookEventInvalid (one wrapping idem.ErrStoreUnavailable
	// 503), and nothing is recorded. It runs after Verify: it may trust
	// the body. Default none: one account.
	Account WebhookValue

	// EventID reads the provider's event id, which becomes the key:
	// JSONValue("id") for Stripe. It must be 1-255 printable ASCII
	// characters. An error, or an id that is not a key, answers 400
	// ProblemWebhookEventInvalid and nothing is recorded. It runs after
	// Verify, and only what the signature covers can be trusted: an id
	// read from an unsigned header (GitHub's X-GitHub-Delivery; GitHub
	// signs the body alone) lets anyone who captured a delivery replay it
	// under a fresh id, and run it again. docs/webhooks.md says what to do
	// for such providers. Required.
	EventID WebhookValue

	// Verify checks the delivery's signature over the raw body, before
	// anything else reads the body and before anything is stored: compare
	// MACs with hmac.Equal (constant time) and refuse timestamps outside a
	// tolerance, against replays of a captured delivery. An error answers
	// 400 ProblemWebhookSignatureInvalid (the error is logged, never
	// sent), unless it is a *Problem, which is written as it is, or wraps
	// idem.ErrStoreUnavailable (the secret is looked up in the database,
	// which did not answer), which answers 503 ProblemStoreUnavailable.
	// Nothing is recorded and nothing runs. Required: an endpoint that
	// books whatever anyone posts to it is not a webhook receiver.
	Verify func(r *http.Request, body []byte) error

	// Content returns what is compared between deliveries of one event:
	// the key's fingerprint is taken over it (as canonical JSON), so a
	// delivery of the event id whose Content differs from the first's is
	// refused 422 ProblemWebhookEventReused. Default the whole body. Set it
	// when the provider changes the body between deliveries of one event
	// (an attempt counter; Stripe's "pending_webhooks" counts the
	// endpoints still to be notified), or every redelivery would be
	// refused: return the body without those members, as JSON. What it
	// leaves out must not matter to the flow, since a redelivery that
	// differs only there gets the first delivery's stored response. It runs
	// after Verify, EventID and Account; an error, or a result that is not
	// JSON, answers 400 ProblemWebhookEventInvalid (a *Problem as it is,
	// one wrapping idem.ErrStoreUnavailable 503), and nothing is recorded.
	Content func(r *http.Request, body []byte) ([]byte, error)

	// MaxBodyBytes limits the delivery's body; a larger one answers 413
	// before Verify runs. Default MaxBodyBytesDefault, 1 MiB.
	MaxBodyBytes int64

	// RedeliveryWindow is how long the provider redelivers an event it got
	// no 2xx for. NewWebhook refuses a flow whose finished keys the runner
	// keeps for less (runner.Retention: FlowConfig.Retention, else
	// Config.Retention, 24 h by default), or whose unfinished keys it
	// deletes sooner (runner.UnfinishedRetention): a redelivery after that
	// would run the event again. Default RedeliveryWindowDefault, 72 h
	// (Stripe's three days).
	RedeliveryWindow time.Duration

	// ReplayHeaders names response headers that are sent, and replayed,
	// besides Content-Type; as Config.ReplayHeaders. Default none.
	ReplayHeaders []string

	// ProblemTypeBase prefixes the names of problem types; as
	// Config.ProblemTypeBase. Default ProblemTypeBaseDefault.
	ProblemTypeBase string

	// UnavailableRetryAfter is the Retry-After sent when the key store is
	// unreachable, rounded up to whole seconds. Default
	// UnavailableRetryAfterDefault, 5s.
	UnavailableRetryAfter time.Duration

	// ReconcileRetryAfter is the Retry-After sent for an event whose key
	// waits for reconciliation, rounded up to whole seconds. Default
	// ReconcileRetryAfterDefault, 60s.
	ReconcileRetryAfter time.Duration

	// Logger receives the receiver's logs: refused signatures, signed
	// deliveries whose event cannot be identified and redeliveries with
	// another body at warn, panics at error. Default: the runner's logger.
	Logger *slog.Logger
}

// providerName is what WebhookConfig.Provider may be.
var providerName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// validate checks c and sets the defaults of the fields left zero.
func (c *WebhookConfig) validate() error {
	var errs []error
	if !providerName.MatchString(c.Provider) {
		errs = append(errs, fmt.Errorf("Provider %q must be 1-64 characters of a-z, 0-9, '.', '_' and '-'", c.Provider))
	}
	if c.EventID == nil {
		errs = append(errs, errors.New("EventID is required: read the provider's event id with JSONValue or HeaderValue"))
	}
	if c.Verify == nil {
		errs = append(errs, errors.New("Verify is required: check the provider's signature before anything is stored"))
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxBodyBytes %d is negative", c.MaxBodyBytes))
	}
	if c.RedeliveryWindow < 0 {
		errs = append(errs, fmt.Errorf("RedeliveryWindow %s is negative", c.RedeliveryWindow))
	}
	c.RedeliveryWindow = cmp.Or(c.RedeliveryWindow, RedeliveryWindowDefault)
	return errors.Join(errs...)
}

// Webhook receives a provider's webhook deliveries and runs each event
// through a flow once, however often the provider delivers it: the key is
// the provider's event id, scoped to WebhookConfig.Provider and the
// account, and the fingerprint is taken over the body as delivered (or
// what WebhookConfig.Content keeps of it). It is an http.Handler for POST;
// it is safe for concurrent use.
//
//	delivery                            answer
//	signature refused (Verify)          400 webhook-signature-invalid; nothing stored, nothing run
//	no event id (EventID, Account)      400 webhook-event-invalid; nothing stored
//	first delivery                      the flow's response (answer 2xx for every event handled or ignored)
//	redelivery, event finished          the stored response, byte for byte, Idempotent-Replayed: true; nothing runs
//	redelivery, event running           503 webhook-event-in-progress + Retry-After: a provider that redelivers delivers again later
//	same event id, another body/route   422 webhook-event-reused, logged at warn and counted as idem.EventMismatch
//	a phase failed                      500 request-failed; the next redelivery resumes after the committed phases
//
// The other outcomes (store unavailable, needs reconcile, too many keys,
// an abandoned event, a panic in Verify, EventID, Account or Content, an
// over-long body, a body that does not decode into In) are answered as by
// [Handler]; a body that no longer decodes is first tried as a
// redelivery of the key those bytes made (idem.Request.RetryOnly). Every
// answer but the flow's own is non-2xx, so the provider delivers the event
// again if it redelivers at all (Stripe does; GitHub only resends by
// hand). docs/webhooks.md has the whole contract.
type Webhook[In any] struct {
	h   *Handler[In]
	cfg WebhookConfig
}

// NewWebhook makes a receiver of webhook deliveries that runs flow on
// runner once per event. cfg must set Provider, Verify and EventID; the
// flow's retention (see WebhookConfig.RedeliveryWindow) must cover the
// provider's redelivery window.
func NewWebhook[In any](runner *idem.Runner, flow *idem.Flow[In], cfg *WebhookConfig) (*Webhook[In], error) {
	if runner == nil {
		return nil, errors.New("idemhttp: NewWebhook needs a runner")
	}
	if flow == nil {
		return nil, errors.New("idemhttp: NewWebhook needs a flow")
	}
	if cfg == nil {
		return nil, errors.New("idemhttp: NewWebhook needs a WebhookConfig: Provider, Verify and EventID are required")
	}
	if err := registered(runner, flow); err != nil {
		return nil, fmt.Errorf("idemhttp: %w", err)
	}
	wh := &Webhook[In]{cfg: *cfg}
	wh.cfg.ReplayHeaders = append([]string(nil), cfg.ReplayHeaders...)
	err := wh.cfg.validate()
	if retention := runner.Retention(flow); retention < wh.cfg.RedeliveryWindow {
		err = errors.Join(err, fmt.Errorf("the runner keeps the flow's finished keys for %s, less than RedeliveryWindow %s: "+
			"a redelivery after that would run the event again; set the flow's FlowConfig.Retention (or the runner's Config.Retention) to at least %s",
			retention, wh.cfg.RedeliveryWindow, wh.cfg.RedeliveryWindow))
	}
	if abandon := runner.UnfinishedRetention(flow); abandon >= 0 && abandon < wh.cfg.RedeliveryWindow {
		err = errors.Join(err, fmt.Errorf("the runner abandons the flow's unfinished keys after %s, less than RedeliveryWindow %s: "+
			"a redelivery after that would run the event from its first phase again; set FlowConfig.UnfinishedRetention (or Config.UnfinishedRetention) to at least %s",
			abandon, wh.cfg.RedeliveryWindow, wh.cfg.RedeliveryWindow))
	}
	h := &Handler[In]{runner: runner, flow: flow, cfg: Config[In]{
		Scope:                 func(*http.Request) (string, error) { return "", errors.New("unused") },
		MaxBodyBytes:          wh.cfg.MaxBodyBytes,
		ReplayHeaders:         wh.cfg.ReplayHeaders,
		AllowUnknownFields:    true, // providers add members to their events without notice
		ProblemTypeBase:       wh.cfg.ProblemTypeBase,
		UnavailableRetryAfter: wh.cfg.UnavailableRetryAfter,
		ReconcileRetryAfter:   wh.cfg.ReconcileRetryAfter,
		Logger:                wh.cfg.Logger,
	}}
	replay, applyErr := h.cfg.apply()
	if err = errors.Join(err, applyErr); err != nil {
		return nil, fmt.Errorf("idemhttp: invalid webhook config for flow %q: %w", flow.Name(), err)
	}
	h.replay = replay
	h.log = cmp.Or(h.cfg.Logger, runner.Config().Logger)
	wh.h = h
	return wh, nil
}

// Flow returns the flow the receiver runs.
func (wh *Webhook[In]) Flow() *idem.Flow[In] { return wh.h.flow }

// Scope returns the scope of the keys of account's events:
// "webhook:Provider", or "webhook:Provider/account" (WebhookScopePrefix).
// With the event id as the key, it finds an event's key (idem keys show,
// Store.GetKey).
func (wh *Webhook[In]) Scope(account string) string {
	if account == "" {
		return WebhookScopePrefix + wh.cfg.Provider
	}
	return WebhookScopePrefix + wh.cfg.Provider + "/" + account
}

// ServeHTTP receives one delivery. A method other than POST answers 405
// with Allow: POST.
func (wh *Webhook[In]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := wh.h
	if r.Method != http.MethodPost {
		h.writeProblem(w, h.methodNotAllowed(r.Method, []string{http.MethodPost}))
		return
	}
	responded := false
	defer h.recoverPanic(w, r, &responded)
	req, p := wh.admit(w, r)
	if p != nil && req.RetryOnly {
		// A body this release cannot decode may be the redelivery of an
		// event an earlier release handled: its key answers it (the
		// stored response, or the event resumed); without one, the
		// problem. A key made from another body is the event id reused,
		// as for a body that decodes.
		out, err := h.runner.Execute(context.WithoutCancel(r.Context()), h.flow, req)
		responded = true
		if errors.Is(err, idem.ErrNotFound) || errors.Is(err, idem.ErrNoRedrive) || errors.Is(err, idem.ErrInvalidRequest) {
			h.writeProblem(w, p)
			return
		}
		wh.writeOutcome(w, r, req, out, err)
		return
	}
	if p != nil {
		responded = true
		h.writeProblem(w, p)
		return
	}
	// The event runs to completion even if the provider hangs up: its
	// redelivery then gets the stored response.
	out, err := h.runner.Execute(context.WithoutCancel(r.Context()), h.flow, req)
	responded = true
	wh.writeOutcome(w, r, req, out, err)
}

// admit turns a delivery into a runner request, or into the problem that
// refuses it; nothing is stored here. The signature is checked first,
// before anything else reads the body.
func (wh *Webhook[In]) admit(w http.ResponseWriter, r *http.Request) (idem.Request, *Problem) {
	h, ctx := wh.h, r.Context()
	body, p := h.readBody(w, r)
	if p != nil {
		return idem.Request{}, p
	}
	if err := wh.cfg.Verify(r, body); err != nil {
		if p, ok := errors.AsType[*Problem](err); ok {
			return idem.Request{}, p
		}
		if errors.Is(err, idem.ErrStoreUnavailable) {
			h.log.ErrorContext(ctx, "idemhttp: webhook Verify could not reach the database; nothing was recorded",
				"flow", h.flow.Name(), "provider", wh.cfg.Provider, "err", err)
			return idem.Request{}, h.storeUnavailable(storeUnavailableBeforeDetail)
		}
		h.log.WarnContext(ctx, "idemhttp: webhook signature refused; nothing was recorded",
			"flow", h.flow.Name(), "provider", wh.cfg.Provider, "err", err)
		return idem.Request{}, h.problem(specWebhookSignatureInvalid,
			"The delivery's signature could not be verified, so it was not processed and nothing was recorded.")
	}
	id, err := wh.cfg.EventID(r, body)
	if err != nil {
		return idem.Request{}, wh.eventInvalid(ctx, "The event id could not be read: "+clip(err.Error())+".", err)
	}
	if !idem.ValidKey(id) {
		return idem.Request{}, wh.eventInvalid(ctx, fmt.Sprintf("The event id %q is not 1-255 printable ASCII characters.", clip(id)), nil)
	}
	account := ""
	if wh.cfg.Account != nil {
		if account, err = wh.cfg.Account(r, body); err != nil {
			return idem.Request{}, wh.eventInvalid(ctx, "The event's account could not be read: "+clip(err.Error())+".", err)
		}
	}
	scope := wh.Scope(account)
	if !validScope(scope) {
		return idem.Request{}, wh.eventInvalid(ctx, fmt.Sprintf("The event's account %q is not 1-%d bytes of UTF-8 without NUL.",
			clip(account), 254-len(WebhookScopePrefix)-len(wh.cfg.Provider)), nil)
	}
	content := body
	if wh.cfg.Content != nil {
		if content, err = wh.cfg.Content(r, body); err != nil {
			return idem.Request{}, wh.eventInvalid(ctx, "The event's content could not be read: "+clip(err.Error())+".", err)
		}
		if content == nil {
			return idem.Request{}, wh.eventInvalid(ctx, "The event's content could not be read: WebhookConfig.Content returned none.", nil)
		}
		if !json.Valid(content) {
			// The fingerprint canonicalises JSON: anything else would be
			// refused later as the provider's invalid input.
			return idem.Request{}, wh.eventInvalid(ctx, "The event's content could not be read: WebhookConfig.Content returned something that is not JSON.", nil)
		}
	}
	in, p := decodeBody[In](h, body)
	if p != nil {
		return idem.Request{Scope: scope, Key: id, Method: http.MethodPost, Path: route(r), Payload: content, RetryOnly: true}, p
	}
	// The fingerprint is taken over the body as the provider sent it (its
	// canonical JSON), or what WebhookConfig.Content keeps of it: a
	// redelivery of the same event matches, the same event id with another
	// body does not.
	return idem.Request{Scope: scope, Key: id, Method: http.MethodPost, Path: route(r), Params: in, Payload: content}, nil
}

// eventInvalid is the 400 for a delivery whose event cannot be identified;
// an error wrapping idem.ErrStoreUnavailable is the 503 instead.
func (wh *Webhook[In]) eventInvalid(ctx context.Context, detail string, err error) *Problem {
	if p, ok := errors.AsType[*Problem](err); ok {
		return p
	}
	if errors.Is(err, idem.ErrStoreUnavailable) {
		wh.h.log.ErrorContext(ctx, "idemhttp: webhook EventID or Account could not reach the database; nothing was recorded",
			"flow", wh.h.flow.Name(), "provider", wh.cfg.Provider, "err", err)
		return wh.h.storeUnavailable(storeUnavailableBeforeDetail)
	}
	// The delivery is signed: the provider sent it, and will send it
	// again. An operator must see it.
	wh.h.log.WarnContext(ctx, "idemhttp: webhook event cannot be identified; nothing was recorded",
		"flow", wh.h.flow.Name(), "provider", wh.cfg.Provider, "detail", detail, "err", err)
	return wh.h.problem(specWebhookEventInvalid, detail)
}

// writeOutcome answers the runner's outcome: the webhook's own problems for
// an event that runs or was delivered with another body, the Handler's
// answers for the rest.
func (wh *Webhook[In]) writeOutcome(w http.ResponseWriter, r *http.Request, req idem.Request, out *idem.Outcome, err error) {
	h := wh.h
	switch out.Kind {
	case idem.OutcomeInProgress, idem.OutcomeLockLost:
		// 503 rather than the Handler's 409: a provider that redelivers
		// at all redelivers a 503, while some give up on a 4xx.
		p := h.problem(specWebhookEventInProgress, "Another delivery of this event is being processed. "+
			"Deliver it again after the time in Retry-After to get its result.")
		after := out.RetryAfter
		if out.Kind == idem.OutcomeLockLost || after <= 0 {
			after = time.Second
		}
		p.Header = retryAfter(after)
		h.writeProblem(w, p)
	case idem.OutcomeMismatch:
		// The runner counted it (idem.EventMismatch, for this flow); the
		// log line names the event, which the provider will keep
		// delivering until it gives up, and the runner's error names the
		// flow, method and route the key was first used with.
		// The scope carries the account (a Connect account id) and the
		// key the event id: both only under the runner's LogKeys.
		h.log.WarnContext(r.Context(), "idemhttp: webhook event delivered again with another body; refused",
			h.runner.LogAttrs(req.Scope, req.Key, out.Record, "flow", h.flow.Name(), "provider", wh.cfg.Provider, "err", h.runner.LogError(err, req.Scope, req.Key))...)
		h.writeProblem(w, h.problem(specWebhookEventReused, "This event id was first delivered with another body. "+
			"The delivery was not processed; the event's first delivery stands."))
	default:
		h.writeOutcome(w, r, req, out, err)
	}
}
