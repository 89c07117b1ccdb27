package idemgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemgrpc"
	"github.com/go-idem/idem/idemgrpc/internal/testpb"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/pgstore"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// phaseTx is what a phase gets to write with.
type phaseTx = idem.Tx

type orderInput = idemgrpc.Input[*testpb.CreateOrderRequest]

type orderHandler = idemgrpc.Handler[*testpb.CreateOrderRequest, *testpb.Order, orderInput]

type orderConfig = idemgrpc.Config[*testpb.CreateOrderRequest, *testpb.Order, orderInput]

const (
	testUser  = "alice"
	testScope = "user:alice"
)

// bundle is what the contract tests share: a migrated schema of their own,
// a runner on it, the orders flow whose phases count their runs and take
// injected behaviour, and an idempotent payment provider.
type bundle struct {
	schema     *pgtest.Schema
	store      *pgstore.Store
	clock      *idemtest.Clock
	runner     *idem.Runner
	flow       *idem.Flow[orderInput]
	provider   *provider
	counts     *phaseCounts
	finished   chan string // keys whose request finished, from the runner's observer
	inProgress chan string // keys found in progress, from the runner's observer

	hooksMu sync.Mutex
	hooks   map[string]func(ctx context.Context) error
}

func setup(t *testing.T) *bundle {
	t.Helper()
	schema := pgtest.NewMigratedSchema(t)
	_, err := schema.Pool.Exec(context.Background(), `
		CREATE TABLE orders (id bigserial PRIMARY KEY, key_id bigint REFERENCES idem_keys (id) ON DELETE SET NULL,
		                     owner text NOT NULL, sku text NOT NULL, quantity bigint NOT NULL, charge_id text)`)
	require.NoError(t, err)
	store, err := pgstore.New(schema.Pool, &pgstore.Config{Schema: schema.Name})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	b := &bundle{
		schema: schema, store: store,
		clock:      idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
		provider:   &provider{charges: map[string]string{}},
		counts:     &phaseCounts{},
		finished:   make(chan string, 16),
		inProgress: make(chan string, 16),
		hooks:      map[string]func(context.Context) error{},
	}
	b.flow = b.orderFlow()
	b.runner = b.newRunner(t, store)
	return b
}

func (b *bundle) newRunner(t *testing.T, store idemdriver.Store, adjust ...func(*idem.Config)) *idem.Runner {
	t.Helper()
	cfg := &idem.Config{
		Flows: []idem.AnyFlow{b.flow},
		Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) {
			ch := map[idem.EventKind]chan string{idem.EventFinished: b.finished, idem.EventInProgress: b.inProgress}[e.Kind]
			if ch != nil {
				select {
				case ch <- e.Key:
				default:
				}
			}
		}),
		Test: idem.TestConfig{Now: b.clock.Now},
	}
	for _, a := range adjust {
		a(cfg)
	}
	r, err := idem.NewRunner(store, cfg)
	require.NoError(t, err)
	return r
}

// orderFlow creates the order, charges it (or stores a decline), and
// responds with the order.
func (b *bundle) orderFlow() *idem.Flow[orderInput] {
	hook := func(ctx context.Context, phase string) error {
		b.counts.add(phase)
		if h := b.hook(phase); h != nil {
			return h(ctx)
		}
		return nil
	}
	return idem.MustNewFlow("orders.create", []idem.Phase[orderInput]{
		{Name: "order_created", Do: func(ctx context.Context, tx phaseTx, a *idem.Attempt[orderInput]) (idem.Result, error) {
			if err := hook(ctx, "order_created"); err != nil {
				return idem.Result{}, err
			}
			req := a.Input().Message
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO orders (key_id, owner, sku, quantity) VALUES ($1, $2, $3, $4) RETURNING id`,
				a.Key().ID, a.Key().Scope, req.GetSku(), req.GetQuantity()).Scan(&id)
			if err != nil {
				return idem.Result{}, err
			}
			return idem.Advance(), a.SetCheckpoint("order_id", id)
		}},
		{Name: "charged", Do: func(ctx context.Context, tx phaseTx, a *idem.Attempt[orderInput]) (idem.Result, error) {
			if err := hook(ctx, "charged"); err != nil {
				return idem.Result{}, err
			}
			if a.Input().Message.GetCard() == "declined" {
				st, err := status.New(codes.FailedPrecondition, "The card was declined.").
					WithDetails(&errdetails.ErrorInfo{Reason: "CARD_DECLINED", Domain: "orders.test"})
				if err != nil {
					return idem.Result{}, err
				}
				return idemgrpc.RespondStatus(st)
			}
			var chargeID string
			if err := a.Foreign(ctx, "charge", func(_ context.Context, key string) error {
				chargeID = b.provider.charge(key)
				return nil
			}); err != nil {
				return idem.Result{}, err
			}
			_, err := tx.Exec(ctx, `UPDATE orders SET charge_id = $1 WHERE key_id = $2`, chargeID, a.Key().ID)
			return idem.Advance(), err
		}},
		{Name: "responded", Do: func(ctx context.Context, tx phaseTx, a *idem.Attempt[orderInput]) (idem.Result, error) {
			if err := hook(ctx, "responded"); err != nil {
				return idem.Result{}, err
			}
			order := &testpb.Order{Sku: a.Input().Message.GetSku(), Quantity: a.Input().Message.GetQuantity()}
			err := tx.QueryRow(ctx, `SELECT id, charge_id FROM orders WHERE key_id = $1`, a.Key().ID).Scan(&order.OrderId, &order.ChargeId)
			if err != nil {
				return idem.Result{}, err
			}
			return idemgrpc.Respond(order)
		}},
	}, nil)
}

func (b *bundle) setHook(phase string, h func(ctx context.Context) error) {
	b.hooksMu.Lock()
	defer b.hooksMu.Unlock()
	b.hooks[phase] = h
}

func (b *bundle) hook(phase string) func(ctx context.Context) error {
	b.hooksMu.Lock()
	defer b.hooksMu.Unlock()
	return b.hooks[phase]
}

// blockPhase makes the next run of phase wait, after closing entered, until
// release is closed. Later runs pass straight through.
func (b *bundle) blockPhase(phase string) (entered <-chan struct{}, release chan<- struct{}) {
	in, out := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b.setHook(phase, func(context.Context) error {
		first := false
		once.Do(func() { first = true })
		if first {
			close(in)
			<-out
		}
		return nil
	})
	return in, out
}

// config is the handler configuration the tests start from.
func (b *bundle) config() *orderConfig {
	return &orderConfig{
		FullMethod: testpb.Orders_CreateOrder_FullMethodName,
		Scope:      userScope,
		Validate: func(_ context.Context, req *testpb.CreateOrderRequest) error {
			if req.GetSku() == "" {
				st, _ := status.New(codes.InvalidArgument, "sku is required").WithDetails(&errdetails.BadRequest{
					FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "sku", Description: "is required"}},
				})
				return st.Err()
			}
			if req.GetQuantity() <= 0 {
				return errors.New("quantity must be positive")
			}
			return nil
		},
	}
}

func (b *bundle) handler(t *testing.T, runner *idem.Runner, adjust func(*orderConfig)) *orderHandler {
	t.Helper()
	cfg := b.config()
	if adjust != nil {
		adjust(cfg)
	}
	h, err := idemgrpc.New(runner, b.flow, cfg)
	require.NoError(t, err)
	return h
}

// serve starts a gRPC server on an in-memory connection, CreateOrder served
// by create through the interceptor and CancelOrder by cancel (if not nil)
// through the per-method handler, and returns a connection to it.
func serve(t *testing.T, create idemgrpc.Method, cancel *orderHandler, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	var methods []idemgrpc.Method
	if create != nil {
		methods = append(methods, create)
	}
	interceptor, err := idemgrpc.UnaryServerInterceptor(methods...)
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(authenticate, interceptor))
	testpb.RegisterOrdersServer(srv, &ordersServer{cancel: cancel})
	lis := bufconn.Listen(1 << 20)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///orders", append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// serveTCP is serve over a real TCP connection on the loopback interface,
// for the tests of what grpc-go's own retries do with the answers.
func serveTCP(t *testing.T, create idemgrpc.Method, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	return serveTCPAfter(t, nil, create, opts...)
}

// serveTCPAfter is serveTCP with another interceptor of the service's
// before idemgrpc's, when not nil.
func serveTCPAfter(t *testing.T, other grpc.UnaryServerInterceptor, create idemgrpc.Method, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	interceptor, err := idemgrpc.UnaryServerInterceptor(create)
	require.NoError(t, err)
	chain := []grpc.UnaryServerInterceptor{authenticate, interceptor}
	if other != nil {
		chain = []grpc.UnaryServerInterceptor{authenticate, other, interceptor}
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(chain...))
	testpb.RegisterOrdersServer(srv, &ordersServer{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// serveOrders is serve for the tests that need only the typed client.
func serveOrders(t *testing.T, create idemgrpc.Method, cancel *orderHandler) testpb.OrdersClient {
	t.Helper()
	return testpb.NewOrdersClient(serve(t, create, cancel))
}

// ordersServer is the service's own implementation: CreateOrder is never
// reached when the interceptor serves it, CancelOrder calls its handler, and
// Ping answers.
type ordersServer struct {
	testpb.UnimplementedOrdersServer
	cancel *orderHandler
}

func (s *ordersServer) CancelOrder(ctx context.Context, req *testpb.CreateOrderRequest) (*testpb.Order, error) {
	if s.cancel == nil {
		return nil, status.Error(codes.Unimplemented, "no handler")
	}
	return s.cancel.Handle(ctx, req)
}

func (s *ordersServer) Ping(_ context.Context, req *testpb.PingRequest) (*testpb.PingResponse, error) {
	return &testpb.PingResponse{Text: "pong: " + req.GetText()}, nil
}

type userKey struct{}

// authenticate is the service's authentication interceptor: the bearer
// token is the user.
func authenticate(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if user, ok := strings.CutPrefix(v, "Bearer "); ok && user != "" {
			ctx = context.WithValue(ctx, userKey{}, user)
		}
	}
	return handler(ctx, req)
}

func userScope(ctx context.Context) (string, error) {
	user, ok := ctx.Value(userKey{}).(string)
	if !ok {
		return "", idemgrpc.ErrUnauthenticated
	}
	return "user:" + user, nil
}

// call sends req as alice with key in the metadata ("" sends none) and
// returns the answer, its error and the response header.
func call(t *testing.T, client testpb.OrdersClient, key string, req *testpb.CreateOrderRequest) (*testpb.Order, error, metadata.MD) {
	t.Helper()
	return callAs(t, client.CreateOrder, testUser, key, req)
}

func callAs(t *testing.T, method func(context.Context, *testpb.CreateOrderRequest, ...grpc.CallOption) (*testpb.Order, error),
	user, key string, req *testpb.CreateOrderRequest) (*testpb.Order, error, metadata.MD) {
	t.Helper()
	ctx := t.Context()
	if user != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+user)
	}
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key)
	}
	var header metadata.MD
	resp, err := method(ctx, req, grpc.Header(&header))
	return resp, err, header
}

func orderRequest() *testpb.CreateOrderRequest {
	return &testpb.CreateOrderRequest{
		Sku: "rocket", Quantity: 2,
		Labels:  map[string]string{"a": "1", "b": "2", "c": "3"},
		Payment: &testpb.CreateOrderRequest_Card{Card: "4242"},
		Notes:   []string{"fragile", "this side up"},
		ShipTo:  &testpb.Address{City: "Paris", Street: "Rue de Rivoli"},
	}
}

// requireStatus checks err's code and ErrorInfo reason and returns the
// status.
func requireStatus(t *testing.T, err error, c codes.Code, reason string) *status.Status {
	t.Helper()
	require.Error(t, err)
	st, ok := status.FromError(err)
	require.True(t, ok, "not a status error: %v", err)
	require.Equal(t, c, st.Code(), "message: %s", st.Message())
	require.Equal(t, reason, errorInfo(st).GetReason(), "message: %s", st.Message())
	return st
}

func errorInfo(st *status.Status) *errdetails.ErrorInfo {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

// retryDelay returns the status's RetryInfo delay, and whether it has one.
func retryDelay(st *status.Status) (time.Duration, bool) {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

func replayed(md metadata.MD) bool {
	v := md.Get(idemgrpc.ReplayedHeader)
	return len(v) == 1 && v[0] == "true"
}

// keyRow returns alice's key row, or nil when there is none.
func (b *bundle) keyRow(t *testing.T, key string) *idemtype.KeyRecord {
	t.Helper()
	rec, err := b.store.GetKey(context.Background(), testScope, key)
	if errors.Is(err, idem.ErrNotFound) {
		return nil
	}
	require.NoError(t, err)
	return rec
}

func (b *bundle) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

// requireNothingWritten checks that a refused call left no trace.
func (b *bundle) requireNothingWritten(t *testing.T) {
	t.Helper()
	require.Zero(t, b.count(t, "idem_keys"), "a refused call must write no key")
	require.Zero(t, b.count(t, "orders"))
	require.Empty(t, b.counts.get())
}

// requireProtoEqual compares two messages as messages.
func requireProtoEqual(t *testing.T, want, got proto.Message) {
	t.Helper()
	require.True(t, proto.Equal(want, got), "want %v\n got %v", want, got)
}

// phaseCounts counts phase runs by name.
type phaseCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *phaseCounts) add(phase string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[phase]++
}

func (c *phaseCounts) get() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

// provider is an idempotent payment provider: the same downstream key
// returns the same charge.
type provider struct {
	mu      sync.Mutex
	charges map[string]string
}

func (p *provider) charge(key string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if id, ok := p.charges[key]; ok {
		return id
	}
	id := fmt.Sprintf("ch_%d", len(p.charges)+1)
	p.charges[key] = id
	return id
}

func (p *provider) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charges)
}
