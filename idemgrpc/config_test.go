package idemgrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemgrpc"
	"github.com/go-idem/idem/idemgrpc/internal/testpb"
)

func TestNewRefusesMisconfiguration(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, tc := range map[string]struct {
		adjust func(*orderConfig)
		want   string
	}{
		"no scope":          {func(c *orderConfig) { c.Scope = nil }, "Config.Scope is required"},
		"no method":         {func(c *orderConfig) { c.FullMethod = "" }, "is not a method name"},
		"malformed method":  {func(c *orderConfig) { c.FullMethod = "idemgrpc.test.v1.Orders/CreateOrder" }, "is not a method name"},
		"unknown method":    {func(c *orderConfig) { c.FullMethod = "/idemgrpc.test.v1.Orders/Nope" }, "has no method Nope"},
		"not a service":     {func(c *orderConfig) { c.FullMethod = "/idemgrpc.test.v1.Order/Nope" }, "is not a service"},
		"other types":       {func(c *orderConfig) { c.FullMethod = testpb.Orders_Ping_FullMethodName }, "takes idemgrpc.test.v1.PingRequest"},
		"unknown key field": {func(c *orderConfig) { c.KeyField = "request" }, `has no field "request"`},
		"key field type":    {func(c *orderConfig) { c.KeyField = "quantity" }, "not a singular string field"},
		"repeated field":    {func(c *orderConfig) { c.KeyField = "notes" }, "not a singular string field"},
		"negative delay":    {func(c *orderConfig) { c.FailedRetryDelay = -time.Second }, "FailedRetryDelay -1s is negative"},
		"shared, no input":  {func(c *orderConfig) { c.SharedKeys = true }, "SharedKeys needs Config.Input"},
		"negative MaxWait":  {func(c *orderConfig) { c.MaxWait = -time.Second }, "MaxWait -1s is negative"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := b.config()
			tc.adjust(cfg)
			_, err := idemgrpc.New(b.runner, b.flow, cfg)
			require.ErrorContains(t, err, tc.want)
		})
	}
	t.Run("no runner, flow or config", func(t *testing.T) {
		t.Parallel()
		_, err := idemgrpc.New(nil, b.flow, b.config())
		require.ErrorContains(t, err, "needs a runner")
		_, err = idemgrpc.New[*testpb.CreateOrderRequest, *testpb.Order, orderInput](b.runner, nil, b.config())
		require.ErrorContains(t, err, "needs a flow")
		_, err = idemgrpc.New[*testpb.CreateOrderRequest, *testpb.Order, orderInput](b.runner, b.flow, nil)
		require.ErrorContains(t, err, "Config.Scope is required")
	})
	t.Run("response type", func(t *testing.T) {
		t.Parallel()
		_, err := idemgrpc.New(b.runner, b.flow, &idemgrpc.Config[*testpb.CreateOrderRequest, *testpb.PingResponse, orderInput]{
			FullMethod: testpb.Orders_CreateOrder_FullMethodName, Scope: userScope,
		})
		require.ErrorContains(t, err, "answers idemgrpc.test.v1.Order, not idemgrpc.test.v1.PingResponse")
	})
	t.Run("custom input needs Config.Input", func(t *testing.T) {
		t.Parallel()
		type custom struct {
			Call   idemgrpc.Input[*testpb.CreateOrderRequest] `json:"call"`
			UserID string                                     `json:"user_id"`
		}
		flow := idem.MustNewFlow("orders.custom", []idem.Phase[custom]{{Name: "p", Do: func(context.Context, phaseTx, *idem.Attempt[custom]) (idem.Result, error) {
			return idemgrpc.Respond(&testpb.Order{})
		}}}, nil)
		cfg := &idemgrpc.Config[*testpb.CreateOrderRequest, *testpb.Order, custom]{FullMethod: testpb.Orders_CreateOrder_FullMethodName, Scope: userScope}
		_, err := idemgrpc.New(b.runner, flow, cfg)
		require.ErrorContains(t, err, "Config.Input is required")
		cfg.Input = func(_ context.Context, req *testpb.CreateOrderRequest) (custom, error) {
			return custom{Call: idemgrpc.Input[*testpb.CreateOrderRequest]{Method: testpb.Orders_CreateOrder_FullMethodName, Message: req}}, nil
		}
		_, err = idemgrpc.New(b.newRunner(t, b.store, func(c *idem.Config) { c.Flows = append(c.Flows, flow) }), flow, cfg)
		require.NoError(t, err)
	})
	t.Run("a flow the runner does not know", func(t *testing.T) {
		t.Parallel()
		// The completer finds a key's flow in the runner's Config.Flows:
		// a flow missing there would leave its failed requests unfinished.
		_, err := idemgrpc.New(b.newRunner(t, b.store, func(c *idem.Config) { c.Flows = nil }), b.flow, b.config())
		require.ErrorContains(t, err, `flow "orders.create" is not in the runner's Config.Flows`)
		// Another flow of the same name: the completer would run its phases.
		other := b.orderFlow()
		_, err = idemgrpc.New(b.runner, other, b.config())
		require.ErrorContains(t, err, `the runner's Config.Flows holds another flow named "orders.create"`)
	})
	t.Run("unregistered method", func(t *testing.T) {
		t.Parallel()
		// A method whose descriptor is not registered cannot be checked,
		// only its name.
		_, err := idemgrpc.New(b.runner, b.flow, &idemgrpc.Config[*testpb.CreateOrderRequest, *emptypb.Empty, orderInput]{
			FullMethod: "/elsewhere.v1.Service/Method", Scope: userScope,
		})
		require.NoError(t, err)
	})
}

func TestUnaryServerInterceptorRefusesMisconfiguration(t *testing.T) {
	t.Parallel()
	b := setup(t)
	create := b.handler(t, b.runner, nil)
	cancel := b.handler(t, b.runner, func(c *orderConfig) { c.FullMethod = testpb.Orders_CancelOrder_FullMethodName })

	_, err := idemgrpc.UnaryServerInterceptor(create, create)
	require.ErrorContains(t, err, "/idemgrpc.test.v1.Orders/CreateOrder is configured twice")
	_, err = idemgrpc.UnaryServerInterceptor(create, cancel)
	require.ErrorContains(t, err, `flow "orders.create" serves both`)
	_, err = idemgrpc.UnaryServerInterceptor(create, nil)
	require.ErrorContains(t, err, "method 1 is nil")
	_, err = idemgrpc.UnaryServerInterceptor()
	require.NoError(t, err, "no methods: everything passes through")
}

func TestRespondHelpers(t *testing.T) {
	t.Parallel()
	_, err := idemgrpc.Respond(nil)
	require.ErrorContains(t, err, "needs a message")
	_, err = idemgrpc.Respond((*testpb.Order)(nil))
	require.ErrorContains(t, err, "needs a message")
	_, err = idemgrpc.Respond(&testpb.Order{Sku: "\xff"})
	require.ErrorContains(t, err, "encode idemgrpc.test.v1.Order")
	res, err := idemgrpc.Respond(&testpb.Order{})
	require.NoError(t, err)
	require.True(t, res.Responds(), "an empty message is a response too")

	_, err = idemgrpc.RespondStatus(nil)
	require.ErrorContains(t, err, "needs an error status")
	_, err = idemgrpc.RespondStatus(status.New(codes.OK, ""))
	require.ErrorContains(t, err, "needs an error status")
	res, err = idemgrpc.RespondStatus(status.New(codes.NotFound, "no such ride"))
	require.NoError(t, err)
	require.True(t, res.Responds())
}

func TestHTTPStatus(t *testing.T) {
	t.Parallel()
	want := map[codes.Code]int{
		codes.OK: 200, codes.Canceled: 499, codes.Unknown: 500, codes.InvalidArgument: 400,
		codes.DeadlineExceeded: 504, codes.NotFound: 404, codes.AlreadyExists: 409, codes.PermissionDenied: 403,
		codes.ResourceExhausted: 429, codes.FailedPrecondition: 400, codes.Aborted: 409, codes.OutOfRange: 400,
		codes.Unimplemented: 501, codes.Internal: 500, codes.Unavailable: 503, codes.DataLoss: 500,
		codes.Unauthenticated: 401, codes.Code(99): 500,
	}
	for c, status := range want {
		require.Equal(t, status, idemgrpc.HTTPStatus(c), c.String())
	}
}
