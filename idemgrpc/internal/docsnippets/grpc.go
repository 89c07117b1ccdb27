// Package docsnippets holds the Go blocks of docs/grpc.md, so that they
// compile: each function here contains one or more blocks verbatim, and the
// repository's TestDocCodeBlocksAreCompiled (docs_test.go at its root) fails
// when a block of the documentation is held by no Go file. The functions
// are never called.
package docsnippets

import (
	"context"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemgrpc"
	"github.com/go-idem/idem/idemgrpc/example/rides/ridespb"
	"github.com/go-idem/idem/idemgrpc/internal/docsnippets/auth"
)

// keyInMetadata holds "The idempotency key": the metadata entry.
func keyInMetadata(ctx context.Context, client ridespb.RidesClient, req *ridespb.CreateRideRequest, key string) (*ridespb.Ride, error) {
	ctx = metadata.AppendToOutgoingContext(ctx, "idempotency-key", key)
	ride, err := client.CreateRide(ctx, req)
	return ride, err
}

// keyInField holds "The idempotency key": the request field.
func keyInField(ctx context.Context, client ridespb.RidesClient, key string, origin, target *ridespb.Point) (*ridespb.Ride, error) {
	ride, err := client.CreateRide(ctx, &ridespb.CreateRideRequest{RequestId: key, Origin: origin, Target: target})
	return ride, err
}

// replayed holds "Replays": reading idempotent-replayed.
func replayed(ctx context.Context, client ridespb.RidesClient, req *ridespb.CreateRideRequest) (*ridespb.Ride, bool, error) {
	var header metadata.MD
	ride, err := client.CreateRide(ctx, req, grpc.Header(&header))
	replayed := len(header.Get("idempotent-replayed")) == 1 && header.Get("idempotent-replayed")[0] == "true"
	return ride, replayed, err
}

const maxAttempts = 10

func backoff(attempt int) time.Duration { return time.Duration(attempt) * 100 * time.Millisecond }

// retry holds "Retrying: what a client should do", by hand.
func retry(ctx context.Context, client ridespb.RidesClient, req *ridespb.CreateRideRequest) (*ridespb.Ride, error) {
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ride, err := client.CreateRide(ctx, req) // req.RequestId is the same on every attempt
		cancel()
		switch status.Code(err) {
		case codes.Unavailable, codes.Aborted, codes.DeadlineExceeded:
			if attempt < maxAttempts {
				break // retry
			}
			fallthrough
		default: // OK, or an answer retrying will not change
			return ride, err
		}
		st := status.Convert(err)
		delay := backoff(attempt)
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				delay = ri.GetRetryDelay().AsDuration()
			}
		}
		time.Sleep(delay)
	}
}

// retryPolicy holds "gRPC's own retries": the service config and the
// client interceptor.
func retryPolicy(target string, creds grpc.DialOption) (*grpc.ClientConn, error) {
	serviceConfig, err := idemgrpc.ServiceConfig("rides.v1.Rides") // the services or full method names idemgrpc serves, and only those
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(target, creds,
		grpc.WithDefaultServiceConfig(serviceConfig),
		grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil)))
	return conn, err
}

// readAnswer holds "gRPC's own retries": the helpers that read an answer.
func readAnswer(ctx context.Context, client ridespb.RidesClient, req *ridespb.CreateRideRequest) (*ridespb.Ride, bool, string, error) {
	var header, trailer metadata.MD
	ride, err := client.CreateRide(ctx, req, grpc.Header(&header), grpc.Trailer(&trailer))
	replayed := idemgrpc.Replayed(header)
	key := idemgrpc.ResponseKey(header, trailer) // "" when no answer came (DEADLINE_EXCEEDED, no connection)
	return ride, replayed, key, err
}

func validateRide(ctx context.Context, req *ridespb.CreateRideRequest) error { return nil }

// wiring holds "Wiring a method".
func wiring(runner *idem.Runner, flow *idem.Flow[idemgrpc.Input[*ridespb.CreateRideRequest]], cancelRide idemgrpc.Method, authenticate grpc.UnaryServerInterceptor) (*grpc.Server, error) {
	type rideInput = idemgrpc.Input[*ridespb.CreateRideRequest]

	createRide, err := idemgrpc.New(runner, flow, &idemgrpc.Config[*ridespb.CreateRideRequest, *ridespb.Ride, rideInput]{
		FullMethod: ridespb.Rides_CreateRide_FullMethodName, // "/rides.v1.Rides/CreateRide"
		Scope: func(ctx context.Context) (string, error) { // required: who owns the key
			user, ok := auth.FromContext(ctx)
			if !ok {
				return "", idemgrpc.ErrUnauthenticated // UNAUTHENTICATED
			}
			return "user:" + user.ID, nil
		},
		KeyField: "request_id", // optional: AIP-155; the metadata entry always works
		UUIDKeys: true,         // optional: keys must be UUIDs
		Validate: validateRide, // optional: an error is INVALID_ARGUMENT
	})
	if err != nil {
		return nil, err
	}

	interceptor, err := idemgrpc.UnaryServerInterceptor(createRide, cancelRide)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(authenticate, interceptor))
	return srv, nil
}

type ridesServer struct {
	ridespb.UnimplementedRidesServer
	createRide *idemgrpc.Handler[*ridespb.CreateRideRequest, *ridespb.Ride, idemgrpc.Input[*ridespb.CreateRideRequest]]
}

func (s *ridesServer) CreateRide(ctx context.Context, req *ridespb.CreateRideRequest) (*ridespb.Ride, error) {
	return s.createRide.Handle(ctx, req)
}

// respond holds "The phases": how a phase answers.
func respond(declined bool, id int64, chargeID string) (idem.Result, error) {
	if declined {
		st, _ := status.New(codes.FailedPrecondition, "Your card was declined.").
			WithDetails(&errdetails.ErrorInfo{Reason: "CARD_DECLINED", Domain: "rides.example"})
		return idemgrpc.RespondStatus(st)
	}
	return idemgrpc.Respond(&ridespb.Ride{RideId: id, ChargeId: chargeID})
}

// rideInput holds "Server-derived input".
type rideInput struct {
	Call   idemgrpc.Input[*ridespb.CreateRideRequest] `json:"call"`
	UserID int64                                      `json:"user_id"`
}
