package idemgrpc_test

import (
	"context"
	"fmt"
	"net"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemgrpc"
	"github.com/go-idem/idem/idemgrpc/internal/testpb"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/migrations"
	"github.com/go-idem/idem/pgstore"
)

// A flow served as a gRPC method through the interceptor: the first call
// runs it, a retry gets the stored answer, and the key sent with another
// request is refused.
func ExampleUnaryServerInterceptor() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, exampleDatabaseURL()) // os.Getenv("DATABASE_URL") in a service
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	m, _ := migrations.New(pool, nil)
	if _, err := m.Up(ctx); err != nil {
		panic(err)
	}
	store, _ := pgstore.New(pool, nil)
	defer store.Close()

	type input = idemgrpc.Input[*testpb.CreateOrderRequest]
	flow := idem.MustNewFlow("orders.create", []idem.Phase[input]{{
		Name: "order_created",
		Do: func(ctx context.Context, tx phaseTx, a *idem.Attempt[input]) (idem.Result, error) {
			var id int64
			if err := tx.QueryRow(ctx, `SELECT 42`).Scan(&id); err != nil { // the order's INSERT
				return idem.Result{}, err
			}
			return idemgrpc.Respond(&testpb.Order{OrderId: id, Sku: a.Input().Message.GetSku()})
		},
	}}, nil)
	runner, _ := idem.NewRunner(store, &idem.Config{Flows: []idem.AnyFlow{flow}})

	createOrder, err := idemgrpc.New(runner, flow, &idemgrpc.Config[*testpb.CreateOrderRequest, *testpb.Order, input]{
		FullMethod: testpb.Orders_CreateOrder_FullMethodName,
		Scope: func(ctx context.Context) (string, error) {
			return "user:alice", nil // from what the authentication interceptor found
		},
		KeyField: "request_id",
	})
	if err != nil {
		panic(err)
	}
	interceptor, err := idemgrpc.UnaryServerInterceptor(createOrder)
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(interceptor))
	testpb.RegisterOrdersServer(srv, testpb.UnimplementedOrdersServer{})
	lis := bufconn.Listen(1 << 20) // net.Listen("tcp", addr) in a service
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	conn, _ := grpc.NewClient("passthrough:///orders", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	defer conn.Close()
	client := testpb.NewOrdersClient(conn)

	order := func(sku string) {
		var header metadata.MD
		req := &testpb.CreateOrderRequest{RequestId: "8e03978e-40d5-43e8-bc93-6894a57f9324", Sku: sku, Quantity: 1}
		resp, err := client.CreateOrder(ctx, req, grpc.Header(&header))
		if err != nil {
			st := status.Convert(err)
			fmt.Println(st.Code(), st.Details()[0].(*errdetails.ErrorInfo).GetReason())
			return
		}
		fmt.Println("order", resp.GetOrderId(), resp.GetSku(), "replayed:", header.Get(idemgrpc.ReplayedHeader))
	}
	order("rocket")
	order("rocket")
	order("balloon")
	// Output:
	// order 42 rocket replayed: []
	// order 42 rocket replayed: [true]
	// FailedPrecondition IDEMPOTENCY_KEY_REUSED
}

// exampleDatabaseURL gives an Example, which has no *testing.T, a fresh
// schema on the test binary's database (see internal/pgtest).
func exampleDatabaseURL() string {
	schema, _, err := pgtest.OpenSchema(context.Background())
	if err != nil {
		panic(err)
	}
	return schema.URL
}
