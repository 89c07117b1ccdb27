// Package idemgrpc serves idem flows as gRPC unary methods, with the same
// contract idemhttp gives HTTP endpoints: a retried call with the same
// idempotency key resumes where the last attempt stopped, or gets the stored
// answer, and never does anything twice.
//
// It is a module of its own (github.com/go-idem/idem/idemgrpc), so services
// that do not use gRPC never depend on google.golang.org/grpc.
//
// # Wiring a method
//
// A [Handler] serves one unary method with one flow. Give it to
// [UnaryServerInterceptor], which then runs the flow in place of the
// service's implementation of the method:
//
//	createRide, err := idemgrpc.New(runner, flow, &idemgrpc.Config[*ridespb.CreateRideRequest, *ridespb.Ride, idemgrpc.Input[*ridespb.CreateRideRequest]]{
//		FullMethod: ridespb.Rides_CreateRide_FullMethodName,
//		Scope: func(ctx context.Context) (string, error) {
//			user, ok := auth.User(ctx) // what the authentication interceptor found
//			if !ok {
//				return "", idemgrpc.ErrUnauthenticated
//			}
//			return "user:" + user.ID, nil
//		},
//		KeyField: "request_id", // AIP-155; the idempotency-key metadata entry always works
//	})
//	interceptor, err := idemgrpc.UnaryServerInterceptor(createRide)
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(authInterceptor, interceptor))
//
// or call [Handler.Handle] from the service's own method:
//
//	func (s *server) CreateRide(ctx context.Context, req *ridespb.CreateRideRequest) (*ridespb.Ride, error) {
//		return s.createRide.Handle(ctx, req)
//	}
//
// The flow's phases read the request from their input ([Input] by default:
// the method's name and the message) and end with [Respond] (the response
// message) or [RespondStatus] (a final error status, such as a declined
// card as FAILED_PRECONDITION). Either is stored with the phase's commit and
// replayed to every retry:
//
//	{Name: "charge_created", Do: func(ctx context.Context, tx idem.Tx, a *idem.Attempt[idemgrpc.Input[*ridespb.CreateRideRequest]]) (idem.Result, error) {
//		...
//		if declined {
//			return idemgrpc.RespondStatus(status.New(codes.FailedPrecondition, "Your card was declined."))
//		}
//		return idemgrpc.Respond(&ridespb.Ride{RideId: id, ChargeId: charge.ID})
//	}}
//
// A flow that also serves HTTP (Config.SharedKeys: one operation, one key
// space over both transports) answers in JSON with idem.RespondJSON instead;
// the handler decodes a stored JSON answer into the response message, or
// into a final status for a non-2xx one ([StatusCode]).
//
// # From call to runner
//
// For a configured method the handler does, in order, and stops at the first
// refusal; every refusal happens before any key is written:
//
//  1. Scope: Config.Scope derives the key's owner from the authenticated
//     caller, never from the request. An error is UNAUTHENTICATED.
//  2. Key: the "idempotency-key" metadata entry, or the string field named
//     by Config.KeyField (AIP-155's request_id); both may be sent if they
//     agree. 1-255 printable ASCII characters, as over HTTP (idem.ValidKey),
//     and a UUID with Config.UUIDKeys. Missing or malformed is
//     INVALID_ARGUMENT. A key sent in the metadata is copied into the key
//     field, so a retry may move it from one to the other.
//  3. Config.Validate: an error is INVALID_ARGUMENT.
//  4. Config.Input builds the flow's input (by default [Input]: the
//     method's full name and the message). The key is fingerprinted over
//     the method and the message as the client sent it (its deterministic
//     wire encoding, unknown fields left out), not over the input: it is
//     bound to the message's value, not to its encoding (field order,
//     unknown fields), and a deploy that adds or renames a field of the
//     message or changes Config.Input does not change it.
//  5. Run: the flow runs detached from the call's cancellation, so a client
//     that gives up does not stop a request half-way; the call answers
//     UNAVAILABLE (REQUEST_UNFINISHED) shortly before its deadline if the
//     flow has not finished, and the flow runs on.
//
// Methods not configured pass through the interceptor untouched.
//
// # From outcome to status
//
//	executed          the stored response message (OK) or stored status
//	replayed          the same, and the header idempotent-replayed: true
//	in progress       ABORTED + RetryInfo (the holder's remaining lease, at most the runner's MaxRetryAfter);
//	                  after waiting (Config.DefaultWait, 10s by default, within the deadline) for the attempt to end
//	lock lost         ABORTED + RetryInfo 1s
//	key reused        FAILED_PRECONDITION + PreconditionFailure: another method or another message
//	needs reconcile   UNAVAILABLE + RetryInfo (Config.ReconcileRetryDelay, 60s)
//	store unavailable UNAVAILABLE + RetryInfo (Config.UnavailableRetryDelay, 5s); fail closed
//	phase failed      UNAVAILABLE + RetryInfo (Config.FailedRetryDelay, 1s); nothing stored, key released.
//	                  ABORTED after repeated serialization failures; INTERNAL after a panic
//	not finished      UNAVAILABLE + RetryInfo (Config.FailedRetryDelay) at the call's deadline less Config.DeadlineMargin
//
// Every status of the adapter's own carries a google.rpc.ErrorInfo with
// domain [ErrorDomain] and one of the Reason* constants. Every answer to a
// call with a valid key echoes the key in an "idempotency-key" entry: a
// response in its header, a status in its trailer, so that the status
// stays a trailers-only response, the only kind gRPC's retry policies
// retry. A status with RetryInfo carries the same delay as the trailer
// grpc-retry-pushback-ms, or -1 (do not retry) when a retry after the
// delay could not be answered within the call's deadline.
//
// # Clients
//
// [ServiceConfig] writes the service config that lets grpc-go's own retry
// policy retry what the adapter asks to be retried, and
// [UnaryClientInterceptor] gives each logical call a fresh key, kept
// across the channel's retries of it:
//
//	serviceConfig, err := idemgrpc.ServiceConfig("rides.v1.Rides")
//	conn, err := grpc.NewClient(target, creds,
//		grpc.WithDefaultServiceConfig(serviceConfig),
//		grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil)))
//
// [Replayed] and [ResponseKey] read an answer's metadata; [RetryDelay]
// its RetryInfo. docs/grpc.md is the reference for client teams: what a
// retry policy can and cannot do with each answer, hedging, and why a
// response header set by another interceptor turns retries off.
package idemgrpc
