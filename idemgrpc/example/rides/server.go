package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemgrpc"
	"github.com/go-idem/idem/idemgrpc/example/rides/ridespb"
	"github.com/go-idem/idem/migrations"
	"github.com/go-idem/idem/pgstore"
)

//go:embed schema.sql
var schemaSQL string

// server is the rides service.
type server struct {
	pool   *pgxpool.Pool
	pay    *payClient
	riders map[string]*rider // by email, loaded at start
	stdout io.Writer
	log    *slog.Logger
}

// serveCommand runs the rides gRPC server until ctx is done.
func serveCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	addr := fs.String("addr", envOr("RIDES_ADDR", "127.0.0.1:5006"), "address to listen on (env RIDES_ADDR)")
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "Postgres; tables go where its search_path says (env DATABASE_URL)")
	payURL := fs.String("payments-url", envOr("PAYMENTS_URL", "http://127.0.0.1:5007"), "the payment provider (env PAYMENTS_URL)")
	lease := fs.Duration("lease", 90*time.Second, "how long a request owns its key without renewing it; a killed server's keys stay locked this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dbURL == "" {
		return errors.New("serve: --database-url (or DATABASE_URL) is required")
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer pool.Close()
	if err := migrate(ctx, pool); err != nil {
		return err
	}
	riders, err := loadRiders(ctx, pool)
	if err != nil {
		return err
	}
	s := &server{pool: pool, pay: &payClient{baseURL: strings.TrimRight(*payURL, "/"), http: &http.Client{Timeout: 10 * time.Second}},
		riders: riders, stdout: stdout, log: log}

	store, err := pgstore.New(pool, nil)
	if err != nil {
		return err
	}
	defer store.Close()
	flow := s.flow()
	runner, err := idem.NewRunner(store, &idem.Config{Lease: *lease, Flows: []idem.AnyFlow{flow}, Logger: log})
	if err != nil {
		return err
	}
	createRide, err := idemgrpc.New(runner, flow, &idemgrpc.Config[*ridespb.CreateRideRequest, *ridespb.Ride, rideInput]{
		FullMethod: ridespb.Rides_CreateRide_FullMethodName,
		Scope:      riderScope,
		KeyField:   "request_id", // AIP-155; the idempotency-key metadata entry works too
		UUIDKeys:   true,
		Validate:   validateRide,
		Input: func(ctx context.Context, req *ridespb.CreateRideRequest) (rideInput, error) {
			r, ok := ctx.Value(riderKey{}).(*rider)
			if !ok {
				return rideInput{}, status.Error(codes.Unauthenticated, "no rider")
			}
			return rideInput{
				Call:   idemgrpc.Input[*ridespb.CreateRideRequest]{Method: ridespb.Rides_CreateRide_FullMethodName, Message: req},
				UserID: r.id,
			}, nil
		},
	})
	if err != nil {
		return err
	}
	idemInterceptor, err := idemgrpc.UnaryServerInterceptor(createRide)
	if err != nil {
		return err
	}
	// The interceptor serves CreateRide: the service's own method is never
	// called, so the generated Unimplemented server stands in for it.
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(s.authenticate, idemInterceptor))
	ridespb.RegisterRidesServer(srv, ridespb.UnimplementedRidesServer{})

	// The maintainer finishes requests whose clients never came back and
	// deletes expired keys, from every instance.
	maintainer, err := idem.NewMaintainer(runner, nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	maintained := make(chan error, 1)
	go func() { maintained <- maintainer.Serve(ctx) }()

	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	fmt.Fprintf(stdout, "listening on %s\n", lis.Addr())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	select {
	case err = <-served:
	case <-ctx.Done():
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			srv.Stop()
		}
	}
	cancel()
	<-maintained
	return err
}

// migrate applies idem's migrations and the service's schema.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	m, err := migrations.New(pool, nil)
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx); err != nil {
		return fmt.Errorf("migrate idem: %w", err)
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('idemgrpc example rides schema'))`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, schemaSQL); err != nil {
			return fmt.Errorf("migrate rides: %w", err)
		}
		return nil
	})
}

// rider is the authenticated caller.
type rider struct {
	id    int64
	email string
}

type riderKey struct{}

// loadRiders reads the users table. The demo's riders are the two the
// schema seeds, so they are read once, at start: authentication then works
// while the database is down, and what a client sees of a down database is
// idem's answer.
func loadRiders(ctx context.Context, pool *pgxpool.Pool) (map[string]*rider, error) {
	rows, err := pool.Query(ctx, `SELECT id, email FROM users`)
	if err != nil {
		return nil, fmt.Errorf("load riders: %w", err)
	}
	riders := map[string]*rider{}
	for rows.Next() {
		r := &rider{}
		if err := rows.Scan(&r.id, &r.email); err != nil {
			return nil, fmt.Errorf("load riders: %w", err)
		}
		riders[r.email] = r
	}
	return riders, rows.Err()
}

// authenticate is the service's authentication, as in rocket-rides-atomic a
// demo: the bearer token is the rider's email.
func (s *server) authenticate(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	var email string
	for _, v := range md.Get("authorization") {
		email, _ = strings.CutPrefix(v, "Bearer ")
	}
	if email == "" {
		return nil, status.Error(codes.Unauthenticated, `send "authorization: Bearer <email>"`)
	}
	r, ok := s.riders[email]
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "unknown rider")
	}
	return handler(context.WithValue(ctx, riderKey{}, r), req)
}

// riderScope is the key's scope: the authenticated rider, never anything
// from the request.
func riderScope(ctx context.Context) (string, error) {
	r, ok := ctx.Value(riderKey{}).(*rider)
	if !ok {
		return "", idemgrpc.ErrUnauthenticated
	}
	return fmt.Sprintf("user:%d", r.id), nil
}

// validateRide checks the coordinates: INVALID_ARGUMENT naming each field at
// fault, before anything is recorded.
func validateRide(_ context.Context, req *ridespb.CreateRideRequest) error {
	var violations []*errdetails.BadRequest_FieldViolation
	check := func(name string, p *ridespb.Point) {
		switch {
		case p == nil:
			violations = append(violations, &errdetails.BadRequest_FieldViolation{Field: name, Description: "is required"})
			return
		case math.IsNaN(p.GetLat()) || math.Abs(p.GetLat()) > 90:
			violations = append(violations, &errdetails.BadRequest_FieldViolation{Field: name + ".lat", Description: "must be between -90 and 90"})
		}
		if math.IsNaN(p.GetLon()) || math.Abs(p.GetLon()) > 180 {
			violations = append(violations, &errdetails.BadRequest_FieldViolation{Field: name + ".lon", Description: "must be between -180 and 180"})
		}
	}
	check("origin", req.GetOrigin())
	check("target", req.GetTarget())
	if len(violations) == 0 {
		return nil
	}
	st, err := status.New(codes.InvalidArgument, "The ride request is invalid.").WithDetails(&errdetails.BadRequest{FieldViolations: violations})
	if err != nil {
		return err
	}
	return st.Err()
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
