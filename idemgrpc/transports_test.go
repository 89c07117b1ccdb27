package idemgrpc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemgrpc"
	"github.com/go-idem/idem/idemgrpc/internal/testpb"
	"github.com/go-idem/idem/idemhttp"
)

// sharedOrder is the input of an operation served over HTTP and gRPC: a type
// of its own, which the HTTP handler decodes from the JSON body and the gRPC
// handler builds from the request message.
type sharedOrder struct {
	SKU      string `json:"sku"`
	Quantity int64  `json:"quantity"`
}

// sharedOrderView is the operation's answer, in JSON: HTTP sends it as it is
// and idemgrpc decodes it into a testpb.Order (its members are the
// message's field names).
type sharedOrderView struct {
	OrderID  int64  `json:"order_id"`
	SKU      string `json:"sku"`
	Quantity int64  `json:"quantity"`
	ChargeID string `json:"charge_id"`
}

// sharedOrderFlow creates the order (or refuses more than 100, a final
// answer stored as a problem), charges it, and answers in JSON.
func (b *bundle) sharedOrderFlow() *idem.Flow[sharedOrder] {
	return idem.MustNewFlow("orders.shared", []idem.Phase[sharedOrder]{
		{Name: "order_created", Do: func(ctx context.Context, tx phaseTx, a *idem.Attempt[sharedOrder]) (idem.Result, error) {
			b.counts.add("order_created")
			in := a.Input()
			if in.Quantity > 100 {
				body, err := json.Marshal(map[string]any{"title": "Too many", "status": 422, "detail": "At most 100 per order."})
				return idem.Respond(http.StatusUnprocessableEntity, http.Header{"Content-Type": {"application/problem+json"}}, body), err
			}
			_, err := tx.Exec(ctx, `INSERT INTO orders (key_id, owner, sku, quantity) VALUES ($1, $2, $3, $4)`,
				a.Key().ID, a.Key().Scope, in.SKU, in.Quantity)
			return idem.Advance(), err
		}},
		{Name: "charged", Do: func(ctx context.Context, tx phaseTx, a *idem.Attempt[sharedOrder]) (idem.Result, error) {
			b.counts.add("charged")
			var chargeID string
			err := a.Foreign(ctx, "charge", func(_ context.Context, key string) error {
				chargeID = b.provider.charge(key)
				return nil
			})
			if err != nil {
				return idem.Result{}, err
			}
			_, err = tx.Exec(ctx, `UPDATE orders SET charge_id = $1 WHERE key_id = $2`, chargeID, a.Key().ID)
			return idem.Advance(), err
		}},
		{Name: "responded", Do: func(ctx context.Context, tx phaseTx, a *idem.Attempt[sharedOrder]) (idem.Result, error) {
			b.counts.add("responded")
			v := sharedOrderView{SKU: a.Input().SKU, Quantity: a.Input().Quantity}
			err := tx.QueryRow(ctx, `SELECT id, charge_id FROM orders WHERE key_id = $1`, a.Key().ID).Scan(&v.OrderID, &v.ChargeID)
			if err != nil {
				return idem.Result{}, err
			}
			return idem.RespondJSON(http.StatusCreated, v), nil
		}},
	}, nil)
}

// twoTransports serves the shared order flow over a real HTTP server (POST
// /orders) and a gRPC server (Orders/CreateOrder), both with SharedKeys, on
// one runner. Both take the bearer token as the user, so alice's scope is
// user:alice on either.
func twoTransports(t *testing.T, b *bundle) (httpURL string, client testpb.OrdersClient) {
	t.Helper()
	return serveTwoTransports(t, b, true)
}

// serveTwoTransports is twoTransports with SharedKeys set as shared says.
func serveTwoTransports(t *testing.T, b *bundle, shared bool) (httpURL string, client testpb.OrdersClient) {
	t.Helper()
	flow := b.sharedOrderFlow()
	runner := b.newRunner(t, b.store, func(c *idem.Config) { c.Flows = append(c.Flows, flow) })

	httpConfig := &idemhttp.Config[sharedOrder]{
		Scope: func(r *http.Request) (string, error) {
			user, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || user == "" {
				return "", idemhttp.ErrUnauthenticated
			}
			return "user:" + user, nil
		},
		SharedKeys: true,
	}
	grpcConfig := &idemgrpc.Config[*testpb.CreateOrderRequest, *testpb.Order, sharedOrder]{
		FullMethod: testpb.Orders_CreateOrder_FullMethodName,
		Scope:      userScope,
		Input: func(_ context.Context, req *testpb.CreateOrderRequest) (sharedOrder, error) {
			return sharedOrder{SKU: req.GetSku(), Quantity: req.GetQuantity()}, nil
		},
		SharedKeys: true,
	}
	httpConfig.SharedKeys, grpcConfig.SharedKeys = shared, shared

	overHTTP, err := idemhttp.New(runner, flow, httpConfig)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /orders", overHTTP)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	overGRPC, err := idemgrpc.New(runner, flow, grpcConfig)
	require.NoError(t, err)
	return srv.URL, serveOrders(t, overGRPC, nil)
}

// postOrder sends a JSON body to POST /orders as alice with key and returns
// the status, the body and whether it was a replay.
func postOrder(t *testing.T, url, key, body string) (int, []byte, bool) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/orders", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+testUser)
	req.Header.Set("Idempotency-Key", key)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	got, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, got, res.Header.Get("Idempotent-Replayed") == "true"
}

// One flow served over HTTP and gRPC with SharedKeys is one operation with
// one key space: a request sent over one transport and retried over the
// other with the same key gets the stored answer (no second order, no
// second charge), in the other transport's form; another payload under the
// key is still refused, over either.
func TestOneOperationTwoTransports(t *testing.T) {
	t.Parallel()
	b := setup(t)
	url, client := twoTransports(t, b)

	// HTTP first, retried over gRPC.
	code, body, replay := postOrder(t, url, "k-http-first", `{"sku": "rocket", "quantity": 2}`)
	require.Equal(t, http.StatusCreated, code, "body: %s", body)
	require.False(t, replay)
	var first sharedOrderView
	require.NoError(t, json.Unmarshal(body, &first))
	require.Equal(t, "ch_1", first.ChargeID)
	order, err, md := call(t, client, "k-http-first", &testpb.CreateOrderRequest{Sku: "rocket", Quantity: 2})
	require.NoError(t, err)
	require.True(t, replayed(md), "the gRPC retry must be a replay")
	requireProtoEqual(t, &testpb.Order{OrderId: first.OrderID, Sku: "rocket", Quantity: 2, ChargeId: "ch_1"}, order)

	// gRPC first, retried over HTTP.
	order, err, md = call(t, client, "k-grpc-first", &testpb.CreateOrderRequest{Sku: "comet", Quantity: 3})
	require.NoError(t, err)
	require.False(t, replayed(md))
	require.Equal(t, "ch_2", order.GetChargeId())
	code, body, replay = postOrder(t, url, "k-grpc-first", `{"quantity": 3, "sku": "comet"}`)
	require.Equal(t, http.StatusCreated, code, "body: %s", body)
	require.True(t, replay, "the HTTP retry must be a replay")
	require.JSONEq(t, fmt.Sprintf(`{"order_id": %d, "sku": "comet", "quantity": 3, "charge_id": "ch_2"}`, order.GetOrderId()), string(body))

	// Each request ran once, whichever transport carried it first.
	require.Equal(t, map[string]int{"order_created": 2, "charged": 2, "responded": 2}, b.counts.get())
	require.Equal(t, 2, b.provider.count())
	require.Equal(t, 2, b.count(t, "orders"))
	for _, key := range []string{"k-http-first", "k-grpc-first"} {
		rec := b.keyRow(t, key)
		require.Equal(t, "orders.shared", rec.Flow)
		require.Equal(t, "POST orders.shared", rec.Method+" "+rec.Path, "a shared key is bound to the flow, not to a route or a method")
	}

	// Another payload under a key is refused, over either transport.
	_, err, _ = call(t, client, "k-http-first", &testpb.CreateOrderRequest{Sku: "rocket", Quantity: 5})
	requireStatus(t, err, codes.FailedPrecondition, idemgrpc.ReasonKeyReused)
	code, body, _ = postOrder(t, url, "k-grpc-first", `{"sku": "comet", "quantity": 5}`)
	require.Equal(t, http.StatusUnprocessableEntity, code)
	require.Contains(t, string(body), "idempotency-key-reused")

	// A final refusal the flow stored as a problem is the same refusal
	// over gRPC: FAILED_PRECONDITION with the problem's detail.
	code, body, _ = postOrder(t, url, "k-refused", `{"sku": "rocket", "quantity": 500}`)
	require.Equal(t, http.StatusUnprocessableEntity, code)
	require.Contains(t, string(body), "At most 100 per order.")
	_, err, md = call(t, client, "k-refused", &testpb.CreateOrderRequest{Sku: "rocket", Quantity: 500})
	st, ok := status.FromError(err)
	require.True(t, ok, "not a status: %v", err)
	require.Equal(t, codes.FailedPrecondition, st.Code())
	require.Equal(t, "At most 100 per order.", st.Message())
	require.True(t, replayed(md))

	require.Equal(t, map[string]int{"order_created": 3, "charged": 2, "responded": 2}, b.counts.get(), "nothing ran twice")
	require.Equal(t, 2, b.provider.count())
	t.Logf("3 keys over 2 transports: %d executions of the first phase, %d charges, %d orders", b.counts.get()["order_created"], b.provider.count(), b.count(t, "orders"))
}

// Without SharedKeys a key is bound to its route or method: the two
// transports are two key spaces, and a retry over the other one is refused
// as a reused key (never run a second time).
func TestTwoTransportsWithoutSharedKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	url, client := serveTwoTransports(t, b, false)
	code, body, _ := postOrder(t, url, "k-1", `{"sku": "rocket", "quantity": 2}`)
	require.Equal(t, http.StatusCreated, code, "body: %s", body)
	_, err, _ := call(t, client, "k-1", &testpb.CreateOrderRequest{Sku: "rocket", Quantity: 2})
	requireStatus(t, err, codes.FailedPrecondition, idemgrpc.ReasonKeyReused)
	require.Equal(t, "POST /orders", b.keyRow(t, "k-1").Method+" "+b.keyRow(t, "k-1").Path)
	require.Equal(t, map[string]int{"order_created": 1, "charged": 1, "responded": 1}, b.counts.get())
}

func TestStatusCodeOfAStoredHTTPStatus(t *testing.T) {
	t.Parallel()
	for httpStatus, want := range map[int]codes.Code{
		400: codes.InvalidArgument, 401: codes.Unauthenticated, 402: codes.FailedPrecondition, 403: codes.PermissionDenied,
		404: codes.NotFound, 409: codes.AlreadyExists, 412: codes.FailedPrecondition, 422: codes.FailedPrecondition,
		429: codes.ResourceExhausted, 499: codes.Canceled, 500: codes.Internal, 501: codes.Unimplemented,
		502: codes.Internal, 503: codes.Unavailable, 504: codes.DeadlineExceeded, 302: codes.Internal,
	} {
		require.Equal(t, want, idemgrpc.StatusCode(httpStatus), "HTTP %d", httpStatus)
	}
	// Where HTTPStatus is one to one, StatusCode reverses it.
	for _, c := range []codes.Code{codes.Unauthenticated, codes.PermissionDenied, codes.NotFound, codes.ResourceExhausted,
		codes.Canceled, codes.Unimplemented, codes.Unavailable, codes.DeadlineExceeded} {
		require.Equal(t, c, idemgrpc.StatusCode(idemgrpc.HTTPStatus(c)), "%s", c)
	}
}
