package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/go-idem/idem"
)

// webhookScopePrefix is idemhttp.WebhookScopePrefix, which this module
// does not import: the scopes of webhook receivers' keys.
const webhookScopePrefix = "webhook:"

// ErrUnauthenticated is what a Config.Scope function returns when the call
// carries no valid credentials. Any error from Scope answers
// UNAUTHENTICATED, unless it is a gRPC status error, which is answered as it
// is; returning this one says so plainly.
var ErrUnauthenticated = errors.New("idemgrpc: unauthenticated")

// Config configures a [Handler] for one unary method. Req and Resp are the
// method's request and response message types (generated pointer types such
// as *ridespb.CreateRideRequest); In is the flow's input type, by default
// [Input][Req]. FullMethod and Scope are required.
type Config[Req, Resp proto.Message, In any] struct {
	// FullMethod is the method's full name, "/package.Service/Method", as
	// the generated code's <Service>_<Method>_FullMethodName constant
	// spells it. When the method's descriptor is registered (generated code
	// registers it), New checks that Req and Resp are its types.
	FullMethod string

	// Scope derives the key's scope (the tenant or user that owns keys) from
	// the authenticated call: typically from what an authentication
	// interceptor put in ctx. Required: there is no silent global scope,
	// because the same key sent by two callers must be two requests. Never
	// derive it from the request message.
	//
	// An error answers UNAUTHENTICATED and nothing is recorded; a gRPC
	// status error (say PERMISSION_DENIED) is answered as it is. An empty
	// scope without an error is treated as unauthenticated. A scope that
	// starts with "webhook:" is reserved for idemhttp's webhook receivers
	// (idemhttp.WebhookScopePrefix): it answers INTERNAL, logged, and
	// nothing is recorded, so that no call can take a webhook event's key.
	Scope func(ctx context.Context) (string, error)

	// KeyField names a string field of Req that may carry the key, as
	// AIP-155's request_id does. Empty: only the "idempotency-key" metadata
	// entry is read. With a field, a client may send either, or both with
	// the same value.
	KeyField string

	// UUIDKeys accepts only UUIDs as keys (AIP-155 asks for them). By
	// default any key of 1-255 printable ASCII characters is accepted, as
	// over HTTP.
	UUIDKeys bool

	// KeyOptional runs a call without a key under a key the server makes
	// up: it gets the atomic phases and server-side completion, but a retry
	// of it is a new request. By default a missing key is INVALID_ARGUMENT.
	KeyOptional bool

	// Validate checks the request before anything is recorded. An error
	// answers INVALID_ARGUMENT with its text as the message, unless it is a
	// gRPC status error, which is answered as it is (add BadRequest details
	// to name the fields at fault). Optional.
	Validate func(ctx context.Context, req Req) error

	// Input builds the flow's input from the request. Optional when In is
	// Input[Req]: the default is Input[Req]{Method: FullMethod, Message: req}.
	// A custom input can add server-derived fields (the user id from
	// authentication, say). The key's fingerprint is taken over the request
	// message and the method, not over the input, so a deploy that changes
	// what Input derives does not turn retries into reused keys; what it
	// derives from elsewhere than the message (the caller's identity
	// belongs in Scope) is not compared between attempts. It must survive
	// a JSON round trip (it is stored to re-drive the request), and should
	// include the whole request: hold an Input[Req] in a named field (not
	// an embedded one, whose MarshalJSON would be promoted and drop the
	// struct's other fields).
	//
	// An error answers INTERNAL (the text is logged, never sent), unless it
	// is a gRPC status error, which is answered as it is.
	Input func(ctx context.Context, req Req) (In, error)

	// SharedKeys binds the method's keys to its flow rather than to the
	// method: every handler of the flow that sets it, over gRPC or over
	// HTTP (idemhttp.Config.SharedKeys), serves one operation with one key
	// space, so a request sent over one transport and retried over the
	// other with the same key (and scope) gets the stored answer rather
	// than a second execution. The key is recorded as POST <flow name>.
	// The flow's input must then be a type of its own that both
	// transports make (set Input), and is fingerprinted as JSON, not over
	// the message's wire encoding; a flow that answers in JSON
	// (idem.RespondJSON) answers both. docs/grpc.md, "One operation, two
	// transports", shows the whole pattern. Default false: the key is
	// bound to FullMethod.
	SharedKeys bool

	// UnavailableRetryDelay is the RetryInfo delay sent when the key store
	// is unreachable. Default 5s.
	UnavailableRetryDelay time.Duration

	// ReconcileRetryDelay is the RetryInfo delay sent for a key that waits
	// for reconciliation. Default 60s.
	ReconcileRetryDelay time.Duration

	// FailedRetryDelay is the RetryInfo delay sent when a phase failed and
	// the key was released for a retry, or when the request did not finish
	// before the call's deadline. Default 1s.
	FailedRetryDelay time.Duration

	// DeadlineMargin is how long before the call's deadline the handler
	// stops waiting for the flow and answers UNAVAILABLE with RetryInfo
	// (reason REQUEST_UNFINISHED), so that the client gets an answer it can
	// act on, rather than DEADLINE_EXCEEDED, when the flow is slow or the
	// key store stalls. The flow runs on; the retry gets ABORTED while it
	// runs and its stored answer once it is done. Default 250ms; negative
	// waits for the flow however long it takes. A call without a deadline
	// waits for the flow.
	DeadlineMargin time.Duration

	// DefaultWait is how long a call that finds its key held by another
	// attempt in flight waits for that attempt to end, as if the client
	// had asked to wait (gRPC has no standard way for a client to ask, so
	// every call of the method waits), instead of answering ABORTED
	// (REQUEST_IN_PROGRESS) at once: within the call's deadline less twice
	// DeadlineMargin, and capped by MaxWait when that is set. When the
	// attempt ends, the call gets its stored answer, replayed, or what a
	// retry arriving then gets (UNAVAILABLE with REQUEST_NEEDS_RECONCILE
	// for a key parked for reconciliation; the request itself, resumed,
	// when the attempt failed and released the key or its process died);
	// when it does not end in time, the ABORTED it would have got at once.
	// So a stock client, whose retry policy makes 5 attempts, gets the
	// answer rather than a final ABORTED, and a hedging client's copies get
	// the first attempt's answer. The wait holds no database connection
	// (idem.Request.Wait), and ends when the call does (cancelled, or its
	// client gone); a flow the call took over runs on. Default
	// DefaultWaitTime; negative: no wait.
	DefaultWait time.Duration

	// MaxWait caps DefaultWait (as over HTTP, where it caps the wait a
	// client asks for with Prefer: wait=N). Default 0: no cap but the
	// call's deadline.
	MaxWait time.Duration

	// Logger receives the handler's logs. Default: the runner's logger.
	Logger *slog.Logger
}

// core is what a Handler needs that does not depend on its type parameters.
type core struct {
	runner   *idem.Runner
	flowName string
	method   string
	// path is what the key is bound to: method, or with
	// Config.SharedKeys the flow's name.
	path string
	// shared: Config.SharedKeys, the key is fingerprinted over the decoded
	// input, as every transport builds it.
	shared      bool
	source      keySource
	uuidKeys    bool
	keyOptional bool
	delays      delays
	margin      time.Duration
	// wait: how long a call waits for the attempt of its key in flight.
	wait time.Duration
	// headerWarned: warnHeaderSet has logged at warn once.
	headerWarned atomic.Bool
	log          *slog.Logger
}

// Handler serves one unary method with an idem flow. Call [Handler.Handle]
// from the service's method, or give the handler to
// [UnaryServerInterceptor]. It is safe for concurrent use.
type Handler[Req, Resp proto.Message, In any] struct {
	core
	flow     *idem.Flow[In]
	scope    func(ctx context.Context) (string, error)
	validate func(ctx context.Context, req Req) error
	input    func(ctx context.Context, req Req) (In, error)
	respName string
}

// New returns a handler that serves cfg.FullMethod with flow, run by
// runner. flow must be in the runner's idem.Config.Flows, where the
// completer finds it to finish a request nobody retries.
func New[Req, Resp proto.Message, In any](runner *idem.Runner, flow *idem.Flow[In], cfg *Config[Req, Resp, In]) (*Handler[Req, Resp, In], error) {
	if runner == nil {
		return nil, errors.New("idemgrpc: New needs a runner")
	}
	if flow == nil {
		return nil, errors.New("idemgrpc: New needs a flow")
	}
	if cfg == nil || cfg.Scope == nil {
		return nil, errors.New("idemgrpc: Config.Scope is required: derive the key's scope (tenant or user) from the authenticated caller; there is no global scope")
	}
	h := &Handler[Req, Resp, In]{
		core: core{
			runner: runner, flowName: flow.Name(), method: cfg.FullMethod, path: cfg.FullMethod,
			uuidKeys: cfg.UUIDKeys, keyOptional: cfg.KeyOptional,
			delays: delays{unavailable: DefaultUnavailableRetryDelay, reconcile: DefaultReconcileRetryDelay, failed: DefaultFailedRetryDelay},
			log:    cfg.Logger,
		},
		flow: flow, scope: cfg.Scope, validate: cfg.Validate, input: cfg.Input,
	}
	var errs []error
	if err := registered(runner, flow); err != nil {
		errs = append(errs, err)
	}
	reqName, err := messageName[Req]()
	if err != nil {
		errs = append(errs, fmt.Errorf("request type: %w", err))
	}
	respName, err := messageName[Resp]()
	if err != nil {
		errs = append(errs, fmt.Errorf("response type: %w", err))
	}
	h.respName = string(respName)
	if err := checkMethod(cfg.FullMethod, reqName, respName); err != nil {
		errs = append(errs, err)
	}
	if cfg.KeyField != "" && reqName != "" {
		req, _ := newMessage[Req]()
		fd, err := keyFieldOf(req.ProtoReflect().Descriptor(), cfg.KeyField)
		if err != nil {
			errs = append(errs, err)
		}
		h.source.field = fd
	}
	if cfg.SharedKeys && cfg.Input == nil {
		errs = append(errs, errors.New("SharedKeys needs Config.Input: the default input holds the method's name, so no handler of another method or transport makes the same input"))
	}
	if h.input == nil {
		def, ok := any(defaultInput[Req](cfg.FullMethod)).(func(context.Context, Req) (In, error))
		if !ok {
			errs = append(errs, fmt.Errorf("Config.Input is required: the flow's input is %s, not idemgrpc.Input[%s]", reflect.TypeFor[In](), reflect.TypeFor[Req]()))
		}
		h.input = def
	}
	for _, d := range []struct {
		name string
		v    time.Duration
		dst  *time.Duration
	}{
		{"UnavailableRetryDelay", cfg.UnavailableRetryDelay, &h.delays.unavailable},
		{"ReconcileRetryDelay", cfg.ReconcileRetryDelay, &h.delays.reconcile},
		{"FailedRetryDelay", cfg.FailedRetryDelay, &h.delays.failed},
	} {
		switch {
		case d.v < 0:
			errs = append(errs, fmt.Errorf("%s %s is negative", d.name, d.v))
		case d.v > 0:
			*d.dst = d.v
		}
	}
	if cfg.SharedKeys {
		h.path, h.shared = flow.Name(), true
	}
	if cfg.MaxWait < 0 {
		errs = append(errs, fmt.Errorf("MaxWait %s is negative", cfg.MaxWait))
	}
	switch {
	case cfg.DefaultWait < 0:
		h.wait = 0
	case cfg.DefaultWait == 0:
		h.wait = DefaultWaitTime
	default:
		h.wait = cfg.DefaultWait
	}
	if cfg.MaxWait > 0 {
		h.wait = min(h.wait, cfg.MaxWait)
	}
	h.margin = cfg.DeadlineMargin
	if h.margin == 0 {
		h.margin = DefaultDeadlineMargin
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("idemgrpc: invalid config for %s (flow %q): %w", cfg.FullMethod, flow.Name(), errors.Join(errs...))
	}
	if h.log == nil {
		h.log = runner.Config().Logger
	}
	return h, nil
}

// registered checks that flow is the flow the runner knows by its name
// (idem.Config.Flows). The completer and reconciliation find a key's flow
// there, having only the stored key to go on: a flow missing from it runs
// when called, but a request of it that failed and is not retried would
// never be finished, and the completer would say nothing.
func registered(runner *idem.Runner, flow idem.AnyFlow) error {
	for _, f := range runner.Config().Flows {
		if f.Name() != flow.Name() {
			continue
		}
		if f != flow {
			return fmt.Errorf("the runner's Config.Flows holds another flow named %q than the one given: the completer would finish this method's requests with the other one's phases; pass the same *idem.Flow to both", flow.Name())
		}
		return nil
	}
	return fmt.Errorf("flow %q is not in the runner's Config.Flows: the completer and reconciliation find a key's flow there, so a request of it that failed and is not retried would never be finished; add the flow to idem.Config.Flows", flow.Name())
}

func defaultInput[Req proto.Message](method string) func(context.Context, Req) (Input[Req], error) {
	return func(_ context.Context, req Req) (Input[Req], error) {
		return Input[Req]{Method: method, Message: req}, nil
	}
}

// checkMethod checks that fullMethod is a well-formed method name and, when
// the method is registered, that it is unary and takes req and answers resp.
func checkMethod(fullMethod string, req, resp protoreflect.FullName) error {
	service, method, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if !strings.HasPrefix(fullMethod, "/") || !ok || service == "" || method == "" || strings.Contains(method, "/") {
		return fmt.Errorf("FullMethod %q is not a method name such as /package.Service/Method", fullMethod)
	}
	desc, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(service))
	if err != nil {
		return nil // not registered: nothing to check against
	}
	sd, ok := desc.(protoreflect.ServiceDescriptor)
	if !ok {
		return fmt.Errorf("FullMethod %q: %s is not a service", fullMethod, service)
	}
	md := sd.Methods().ByName(protoreflect.Name(method))
	switch {
	case md == nil:
		return fmt.Errorf("FullMethod %q: service %s has no method %s", fullMethod, service, method)
	case md.IsStreamingClient() || md.IsStreamingServer():
		return fmt.Errorf("FullMethod %q is a streaming method; idemgrpc serves unary methods", fullMethod)
	case req != "" && md.Input().FullName() != req:
		return fmt.Errorf("FullMethod %q takes %s, not %s", fullMethod, md.Input().FullName(), req)
	case resp != "" && md.Output().FullName() != resp:
		return fmt.Errorf("FullMethod %q answers %s, not %s", fullMethod, md.Output().FullName(), resp)
	}
	return nil
}

// FullMethod returns the method the handler serves.
func (h *Handler[Req, Resp, In]) FullMethod() string { return h.method }

// Flow returns the flow the handler runs.
func (h *Handler[Req, Resp, In]) Flow() *idem.Flow[In] { return h.flow }

// Handle runs the flow for one call of the method and returns what the
// client gets: the response message, or a status error. Call it from the
// service's implementation of the method:
//
//	func (s *server) CreateRide(ctx context.Context, req *ridespb.CreateRideRequest) (*ridespb.Ride, error) {
//		return s.createRide.Handle(ctx, req)
//	}
//
// ctx must be the call's context: the key and the replay header travel in
// its metadata. The flow runs with the context's values but without its
// cancellation, so a client that gives up (or whose deadline passes) does not
// interrupt a request half-way; its retry then gets the stored answer.
func (h *Handler[Req, Resp, In]) Handle(ctx context.Context, req Req) (Resp, error) {
	resp, key, st := h.handle(ctx, req)
	if st != nil {
		// An error status goes in a trailers-only response (one HEADERS
		// frame) unless something set a header: the key it echoes rides
		// in its trailer, since a header would make gRPC's retry policies
		// take the status as final.
		md := metadata.MD{}
		if key != "" {
			md.Set(MetadataKey, key)
		}
		delay, retry := retryInfo(st)
		if retry {
			// gRPC's own retry policies wait this long before the next
			// attempt (gRFC A6's server pushback); RetryInfo says the same
			// to clients that retry by hand.
			md.Set(PushbackTrailer, strconv.FormatInt(h.pushback(ctx, delay), 10))
		}
		// Outside a gRPC server (a direct call in a test) there is no
		// stream to set it on; the answer is the same.
		_ = grpc.SetTrailer(ctx, md)
		if retry {
			h.warnHeaderSet(ctx, st)
		}
		var zero Resp
		return zero, st.Err()
	}
	if key != "" {
		_ = grpc.SetHeader(ctx, metadata.Pairs(MetadataKey, key))
	}
	return resp, nil
}

// handle answers the call; key is the key it ran under ("" when it has
// none, or none valid), which the response echoes.
func (h *Handler[Req, Resp, In]) handle(ctx context.Context, req Req) (resp Resp, key string, st *status.Status) {
	defer func() {
		if v := recover(); v != nil {
			h.log.ErrorContext(ctx, "idemgrpc: panic before the flow ran", "method", h.method, "panic", v)
			st = internal()
		}
	}()
	if !validMessage(req) {
		return resp, key, status.New(codes.InvalidArgument, "The request message is missing.")
	}
	// A copy of its own: the flow may outlive the call, and the key field
	// may be filled in.
	req = proto.CloneOf(req)
	scope, err := h.scope(ctx)
	if err != nil || scope == "" {
		if s, ok := status.FromError(err); ok && err != nil {
			return resp, key, s
		}
		h.log.DebugContext(ctx, "idemgrpc: unauthenticated", "method", h.method, "err", err)
		return resp, key, status.New(codes.Unauthenticated, "This method requires an authenticated caller.")
	}
	if strings.HasPrefix(scope, webhookScopePrefix) {
		h.log.ErrorContext(ctx, "idemgrpc: Config.Scope returned a scope reserved for webhook receivers; answering INTERNAL",
			"method", h.method, "reserved_prefix", webhookScopePrefix)
		return resp, key, internal()
	}
	key, sent, kst := h.requestKey(ctx, req)
	if kst != nil {
		return resp, key, kst
	}
	switch {
	case !sent && !h.keyOptional:
		return resp, key, h.keyMissing()
	case !sent:
		key = serverKey()
	case h.source.field != nil && req.ProtoReflect().Get(h.source.field).String() != key:
		// The key came in the metadata: the request as the flow sees it
		// (and fingerprints it) carries it in the field all the same, so
		// a retry may move the key from one to the other.
		req.ProtoReflect().Set(h.source.field, protoreflect.ValueOfString(key))
	}
	if h.validate != nil {
		if err := h.validate(ctx, req); err != nil {
			if s, ok := status.FromError(err); ok {
				return resp, key, s
			}
			return resp, key, status.New(codes.InvalidArgument, err.Error())
		}
	}
	in, err := h.input(ctx, req)
	if err != nil {
		if s, ok := status.FromError(err); ok {
			return resp, key, s
		}
		h.log.ErrorContext(ctx, "idemgrpc: Config.Input failed", "method", h.method, "err", err)
		return resp, key, internal()
	}

	// A key shared with other transports (Config.SharedKeys) is
	// fingerprinted over the decoded input, which every transport builds
	// alike; otherwise over the message as the client sent it.
	var payload []byte
	target := ""
	if !h.shared {
		if payload, err = wirePayload(req); err != nil {
			h.log.ErrorContext(ctx, "idemgrpc: the request cannot be encoded to fingerprint it", "method", h.method, "err", err)
			return resp, key, internal()
		}
		target = h.method
	}

	// The flow runs detached from the call: a client that gives up, or
	// whose deadline passes, must not stop a request half-way. The call
	// waits for it until its deadline is near, and then answers that the
	// request has not finished, rather than let the client see a bare
	// DEADLINE_EXCEEDED, or wait without end on a stalled store.
	type result struct {
		out *idem.Outcome
		err error
	}
	done := make(chan result, 1)
	wait := h.wait
	if dl, ok := ctx.Deadline(); ok && wait > 0 {
		// Stop waiting early enough to answer ABORTED, not
		// REQUEST_UNFINISHED at the deadline less the margin.
		wait = min(wait, max(time.Until(dl)-2*max(h.margin, 0), 0))
	}
	go func() {
		out, err := h.runner.Execute(context.WithoutCancel(ctx), h.flow, idem.Request{
			Scope: scope, Key: key, Method: "POST", Path: h.path, Params: in,
			Payload: payload, PayloadBinary: payload != nil, Target: target, Wait: wait,
			// The wait (not a flow the call runs) ends with the call.
			WaitContext: ctx,
		})
		done <- result{out, err}
	}()
	var deadline <-chan time.Time
	if dl, ok := ctx.Deadline(); ok && h.margin >= 0 {
		timer := time.NewTimer(max(time.Until(dl)-h.margin, 0))
		defer timer.Stop()
		deadline = timer.C
	}
	select {
	case r := <-done:
		resp, st := h.answer(ctx, scope, key, r.out, r.err)
		return resp, key, st
	case <-deadline:
		h.log.WarnContext(ctx, "idemgrpc: the request did not finish before the call's deadline; it runs on", h.runner.LogAttrs(scope, key, nil, "method", h.method)...)
		return resp, key, unfinished(h.delays.failed)
	case <-ctx.Done():
		// The client is gone; nobody reads this answer.
		return resp, key, status.FromContextError(ctx.Err())
	}
}

// warnHeaderSet logs where a status that invites a retry goes out on a
// stream whose response header metadata was set by someone else (another
// interceptor, the service): the response is then not trailers-only, and
// gRPC's retry policies take any status that follows headers as final
// (gRFC A6), so the client's channel will not retry it. The first time per
// method at warn, then at debug. A header sent empty (grpc.SendHeader with
// no metadata) cannot be seen here.
func (h *core) warnHeaderSet(ctx context.Context, st *status.Status) {
	stream, ok := grpc.ServerTransportStreamFromContext(ctx).(interface{ Header() (metadata.MD, error) })
	if !ok {
		return
	}
	md, err := stream.Header()
	if err != nil {
		return
	}
	var names []string
	for name := range md {
		if name != ReplayedHeader && name != MetadataKey {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return
	}
	slices.Sort(names)
	level := slog.LevelDebug
	if h.headerWarned.CompareAndSwap(false, true) {
		level = slog.LevelWarn
	}
	h.log.Log(ctx, level, "idemgrpc: a status that invites a retry goes out after response headers set by another interceptor or the service; "+
		"gRPC's retry policies retry only trailers-only responses, so the client's channel will not retry it: set that metadata with grpc.SetTrailer, or on OK answers only (docs/grpc.md, \"Response headers turn retries off\")",
		"method", h.method, "code", st.Code(), "reason", reasonOf(st), "headers", names)
}

// reasonOf is the ErrorInfo reason of one of the adapter's statuses.
func reasonOf(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// pushback is the grpc-retry-pushback-ms of a status whose RetryInfo asks
// for delay: delay, when a retry after it still has time to be answered
// within the call's deadline, and -1 otherwise. grpc-go sleeps a pushback
// without looking at the deadline, so a delay longer than what is left
// would turn the status into the client's bare DEADLINE_EXCEEDED; a
// negative pushback tells it not to retry (gRFC A6), and the status, with
// its RetryInfo for the caller's own next call, reaches the caller intact.
// What a retry needs is twice the margin: the server answers
// REQUEST_UNFINISHED a margin before the deadline, and the answer must
// travel back.
func (h *core) pushback(ctx context.Context, delay time.Duration) int64 {
	dl, ok := ctx.Deadline()
	if !ok {
		return delay.Milliseconds()
	}
	if time.Until(dl)-delay < 2*max(h.margin, 0) {
		return -1
	}
	return delay.Milliseconds()
}

// answer maps the runner's outcome to the response or status.
func (h *Handler[Req, Resp, In]) answer(ctx context.Context, scope, key string, out *idem.Outcome, err error) (Resp, *status.Status) {
	var zero Resp
	switch out.Kind {
	case idem.OutcomeReplayed, idem.OutcomeInProgress, idem.OutcomeNeedsReconcile, idem.OutcomeRequestAbandoned:
		if out.Record != nil && out.Record.Path != h.path {
			// The key was first used with another method that runs the
			// same flow and made the same input (a custom Config.Input
			// that leaves the method out): it is bound to that method all
			// the same. With Config.SharedKeys, path is the flow's name,
			// which every transport of the operation records.
			return zero, reused(h.source)
		}
	}
	if st, ok := outcomeStatus(out, err, h.delays, h.source); ok {
		switch out.Kind {
		case idem.OutcomeInvalid:
			if !errors.Is(err, idem.ErrInvalidParams) {
				h.log.ErrorContext(ctx, "idemgrpc: the runner refused the request; check Config.Scope and the input type",
					h.runner.LogAttrs(scope, key, out.Record, "method", h.method, "flow", h.flowName, "err", h.runner.LogError(err, scope, key))...)
			}
		case idem.OutcomeFailed, idem.OutcomeStoreUnavailable:
			h.log.WarnContext(ctx, "idemgrpc: request not completed",
				h.runner.LogAttrs(scope, key, out.Record, "method", h.method, "outcome", out.Kind, "err", h.runner.LogError(err, scope, key))...)
		}
		return zero, st
	}
	resp, st, derr := decodeStored[Resp](out.Response, h.respName)
	if derr != nil {
		h.log.ErrorContext(ctx, "idemgrpc: the flow's stored response cannot be answered",
			h.runner.LogAttrs(scope, key, out.Record, "method", h.method, "flow", h.flowName, "err", h.runner.LogError(derr, scope, key))...)
		return zero, internal()
	}
	if out.Kind == idem.OutcomeReplayed {
		// Outside a gRPC server (a direct call in a test) there is no
		// stream to set the header on; the answer is the same.
		_ = grpc.SetHeader(ctx, metadata.Pairs(ReplayedHeader, "true"))
	}
	return resp, st
}

// serve is the interceptor's entry: req is the decoded request of the
// method.
func (h *Handler[Req, Resp, In]) serve(ctx context.Context, req any) (any, error) {
	r, ok := req.(Req)
	if !ok {
		h.log.ErrorContext(ctx, "idemgrpc: the interceptor got a request of another type", "method", h.method, "got", fmt.Sprintf("%T", req), "want", reflect.TypeFor[Req]())
		return nil, internal().Err()
	}
	resp, err := h.Handle(ctx, r)
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (h *Handler[Req, Resp, In]) flowKey() string { return h.flowName }
