package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/go-idem/idem/idemgrpc"
	"github.com/go-idem/idem/idemgrpc/example/rides/ridespb"
)

// A client that retries: the same request, with the same request_id, until
// it gets an answer that retrying cannot change.

// attempt is what one call of CreateRide came to, as the client sees it.
type attempt struct {
	n        int
	ride     *ridespb.Ride
	replayed bool
	status   *status.Status // nil for OK
}

// retryable reports whether the answer is worth a retry with the same
// request_id: the request did not finish (UNAVAILABLE, ABORTED,
// DEADLINE_EXCEEDED), or is still running elsewhere.
func (a attempt) retryable() bool {
	if a.status == nil {
		return false
	}
	switch a.status.Code() {
	case codes.Unavailable, codes.Aborted, codes.DeadlineExceeded:
		return true
	}
	return false
}

// retryInfo returns the delay the server asked for, if it did.
func (a attempt) retryInfo() (time.Duration, bool) {
	if a.status == nil {
		return 0, false
	}
	return idemgrpc.RetryDelay(a.status.Err())
}

func (a attempt) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "attempt %d: ", a.n)
	if a.status == nil {
		fmt.Fprintf(&b, "OK")
		if a.replayed {
			b.WriteString(" (idempotent-replayed: true)")
		}
		fmt.Fprintf(&b, " ride_id=%d charge_id=%s amount=%d %s %q", a.ride.GetRideId(), a.ride.GetChargeId(), a.ride.GetAmount(), a.ride.GetCurrency(), a.ride.GetMessage())
		return b.String()
	}
	b.WriteString(a.status.Code().String())
	if a.replayed {
		b.WriteString(" (idempotent-replayed: true)")
	}
	for _, d := range a.status.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			fmt.Fprintf(&b, " reason=%s", d.GetReason())
		case *errdetails.RetryInfo:
			fmt.Fprintf(&b, " retry_delay=%s", d.GetRetryDelay().AsDuration())
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				fmt.Fprintf(&b, " field=%s(%s)", v.GetField(), v.GetDescription())
			}
		case *errdetails.PreconditionFailure:
			for _, v := range d.GetViolations() {
				fmt.Fprintf(&b, " precondition=%s/%s", v.GetType(), v.GetSubject())
			}
		}
	}
	fmt.Fprintf(&b, ": %s", a.status.Message())
	return b.String()
}

// retryPolicy bounds the client's retries.
type retryPolicy struct {
	attempts       int           // at most this many calls
	attemptTimeout time.Duration // each call's deadline
	backoff        time.Duration // the first wait without RetryInfo; doubles up to maxBackoff
	maxBackoff     time.Duration
}

// bookRide calls CreateRide until it gets an answer retrying cannot change,
// reporting every attempt. md is sent with each call (the authorization and,
// if the client puts it there, the idempotency key).
func bookRide(ctx context.Context, client ridespb.RidesClient, md metadata.MD, req *ridespb.CreateRideRequest, policy retryPolicy, report func(attempt)) attempt {
	wait := policy.backoff
	var last attempt
	for n := 1; ; n++ {
		last = callOnce(ctx, client, md, req, policy.attemptTimeout)
		last.n = n
		report(last)
		if !last.retryable() || n >= policy.attempts || ctx.Err() != nil {
			return last
		}
		delay, ok := last.retryInfo()
		if !ok {
			delay, wait = wait, min(wait*2, policy.maxBackoff)
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return last
		}
	}
}

func callOnce(ctx context.Context, client ridespb.RidesClient, md metadata.MD, req *ridespb.CreateRideRequest, timeout time.Duration) attempt {
	ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(ctx, md), timeout)
	defer cancel()
	var header metadata.MD
	ride, err := client.CreateRide(ctx, req, grpc.Header(&header))
	a := attempt{ride: ride, replayed: strings.Join(header.Get(idemgrpc.ReplayedHeader), ",") == "true"}
	if err != nil {
		a.status = status.Convert(err)
	}
	return a
}

// dial connects to a rides server, reconnecting quickly after it restarts.
func dial(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 2 * time.Second,
		}))
}

// bookCommand books one ride, retrying, and prints every attempt.
func bookCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("book", flag.ContinueOnError)
	addr := fs.String("addr", envOr("RIDES_ADDR", "127.0.0.1:5006"), "the rides server (env RIDES_ADDR)")
	user := fs.String("user", "user@example.com", "the rider's email (user-bad-source@example.com has a declined card)")
	requestID := fs.String("request-id", "", "the booking's request_id; default a new UUID. Send the same one to retry the same booking")
	keyIn := fs.String("key-in", "field", "where the key goes: field (request_id), metadata (idempotency-key), both, or none")
	origin := fs.String("origin", "37.7749,-122.4194", "lat,lon")
	target := fs.String("target", "37.8044,-122.2712", "lat,lon")
	attempts := fs.Int("attempts", 20, "at most this many calls")
	attemptTimeout := fs.Duration("attempt-timeout", 10*time.Second, "each call's deadline")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *requestID == "" {
		*requestID = uuid.NewString()
	}
	o, err := parsePoint(*origin)
	if err != nil {
		return fmt.Errorf("--origin: %w", err)
	}
	t, err := parsePoint(*target)
	if err != nil {
		return fmt.Errorf("--target: %w", err)
	}
	req := &ridespb.CreateRideRequest{Origin: o, Target: t}
	md := metadata.Pairs("authorization", "Bearer "+*user)
	switch *keyIn {
	case "field":
		req.RequestId = *requestID
	case "metadata":
		md.Set(idemgrpc.MetadataKey, *requestID)
	case "both":
		req.RequestId = *requestID
		md.Set(idemgrpc.MetadataKey, *requestID)
	case "none":
	default:
		return fmt.Errorf("--key-in %q: want field, metadata, both or none", *keyIn)
	}

	conn, err := dial(*addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	fmt.Fprintf(stdout, "request_id=%s key_in=%s user=%s\n", *requestID, *keyIn, *user)
	last := bookRide(ctx, ridespb.NewRidesClient(conn), md, req,
		retryPolicy{attempts: *attempts, attemptTimeout: *attemptTimeout, backoff: 100 * time.Millisecond, maxBackoff: 2 * time.Second},
		func(a attempt) { fmt.Fprintln(stdout, a) })
	if last.status != nil {
		return errors.New("no ride booked: " + last.status.Code().String())
	}
	return nil
}

func parsePoint(s string) (*ridespb.Point, error) {
	lat, lon, ok := strings.Cut(s, ",")
	if !ok {
		return nil, fmt.Errorf("%q is not lat,lon", s)
	}
	la, err := strconv.ParseFloat(strings.TrimSpace(lat), 64)
	if err != nil {
		return nil, err
	}
	lo, err := strconv.ParseFloat(strings.TrimSpace(lon), 64)
	if err != nil {
		return nil, err
	}
	return &ridespb.Point{Lat: la, Lon: lo}, nil
}
