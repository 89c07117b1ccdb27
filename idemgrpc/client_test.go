package idemgrpc_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/go-idem/idem/idemgrpc"
	"github.com/go-idem/idem/idemgrpc/internal/testpb"
)

// clientWith serves CreateOrder (with KeyField request_id) over a channel
// configured as docs/grpc.md recommends: ServiceConfig's retry policy and
// UnaryClientInterceptor.
func clientWith(t *testing.T, b *bundle, cfg *idemgrpc.ClientConfig) testpb.OrdersClient {
	t.Helper()
	sc, err := idemgrpc.ServiceConfig("idemgrpc.test.v1.Orders")
	require.NoError(t, err)
	h := b.handler(t, b.runner, func(c *orderConfig) { c.KeyField = "request_id" })
	return testpb.NewOrdersClient(serve(t, h, nil, grpc.WithDefaultServiceConfig(sc),
		grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(cfg))))
}

// alice calls CreateOrder as alice, with extra outgoing metadata, and
// returns the answer's header and trailer.
func alice(t *testing.T, client testpb.OrdersClient, req *testpb.CreateOrderRequest, kv ...string) (*testpb.Order, error, metadata.MD, metadata.MD) {
	t.Helper()
	ctx := metadata.AppendToOutgoingContext(t.Context(), append([]string{"authorization", "Bearer " + testUser}, kv...)...)
	var header, trailer metadata.MD
	order, err := client.CreateOrder(ctx, req, grpc.Header(&header), grpc.Trailer(&trailer))
	return order, err, header, trailer
}

// The interceptor gives each logical call a key of its own, keeps it
// across grpc-go's retries of the call (the first attempt fails in a
// phase, the channel retries after the pushback, and the request resumes
// under the same key), and keeps a key the caller sent.
func TestUnaryClientInterceptor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client := clientWith(t, b, nil)

	// Two calls with the same message: two requests, two keys.
	one, err, h1, _ := alice(t, client, orderRequest())
	require.NoError(t, err)
	two, err, h2, _ := alice(t, client, orderRequest())
	require.NoError(t, err)
	k1, k2 := idemgrpc.ResponseKey(h1), idemgrpc.ResponseKey(h2)
	require.NotEmpty(t, k1)
	require.NotEqual(t, k1, k2)
	require.NotEqual(t, one.GetOrderId(), two.GetOrderId())
	require.False(t, idemgrpc.Replayed(h1))
	require.False(t, idemgrpc.Replayed(h2))

	// The first attempt's phase fails; grpc-go retries it with the same
	// metadata, so the retry resumes the request rather than making one.
	var failed atomic.Bool
	b.setHook("charged", func(context.Context) error {
		if failed.CompareAndSwap(false, true) {
			return errors.New("provider timed out")
		}
		return nil
	})
	three, err, h3, _ := alice(t, client, orderRequest())
	require.NoError(t, err, "the channel retried the failed phase")
	require.True(t, failed.Load())
	require.False(t, idemgrpc.Replayed(h3), "resumed and executed, not replayed")
	require.Equal(t, map[string]int{"order_created": 3, "charged": 4, "responded": 3}, b.counts.get(),
		"the retry resumed at the failed phase under the same key")
	require.Equal(t, 3, b.count(t, "orders"))
	b.setHook("charged", nil)

	// The caller's own key (retry code that resends a failed call's key)
	// is kept: the answer is the stored one.
	again, err, h4, _ := alice(t, client, orderRequest(), idemgrpc.MetadataKey, idemgrpc.ResponseKey(h3))
	require.NoError(t, err)
	require.True(t, idemgrpc.Replayed(h4))
	require.Equal(t, idemgrpc.ResponseKey(h3), idemgrpc.ResponseKey(h4))
	requireProtoEqual(t, three, again)

	// A key in the request's field is the call's key: no metadata entry is
	// added (the server would refuse two keys that disagree).
	fieldClient := clientWith(t, b, &idemgrpc.ClientConfig{KeyField: "request_id"})
	req := orderRequest()
	req.RequestId = "k-field"
	_, err, h5, _ := alice(t, fieldClient, req)
	require.NoError(t, err)
	require.Equal(t, "k-field", idemgrpc.ResponseKey(h5))
	_, err, h6, _ := alice(t, fieldClient, req)
	require.NoError(t, err)
	require.True(t, idemgrpc.Replayed(h6))
	require.Equal(t, 4, b.count(t, "orders"))
}

// Methods limits the interceptor to the calls named; others get no key.
func TestUnaryClientInterceptorMethods(t *testing.T) {
	t.Parallel()
	var got []string
	record := func(ctx context.Context, method string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
		md, _ := metadata.FromOutgoingContext(ctx)
		got = append(got, method+"="+idemgrpc.ResponseKey(md))
		return nil
	}
	n := 0
	ic := idemgrpc.UnaryClientInterceptor(&idemgrpc.ClientConfig{
		Methods: []string{"/a.v1.S/Create", "b.v1.T"},
		NewKey:  func() string { n++; return "key-" + string(rune('0'+n)) },
	})
	for _, m := range []string{"/a.v1.S/Create", "/a.v1.S/Get", "/b.v1.T/Any"} {
		require.NoError(t, ic(t.Context(), m, nil, nil, nil, record))
	}
	require.Equal(t, []string{"/a.v1.S/Create=key-1", "/a.v1.S/Get=", "/b.v1.T/Any=key-2"}, got)
}

func TestServiceConfig(t *testing.T) {
	t.Parallel()
	for _, names := range [][]string{{"rides.v1.Rides"}, {"rides.v1.Rides", "/orders.v1.Orders/Create"}} {
		sc, err := idemgrpc.ServiceConfig(names...)
		require.NoError(t, err)
		var parsed struct {
			MethodConfig []struct {
				Name         []map[string]string `json:"name"`
				WaitForReady bool                `json:"waitForReady"`
				RetryPolicy  struct {
					MaxAttempts int      `json:"maxAttempts"`
					Codes       []string `json:"retryableStatusCodes"`
				} `json:"retryPolicy"`
			} `json:"methodConfig"`
		}
		require.NoError(t, json.Unmarshal([]byte(sc), &parsed))
		require.Len(t, parsed.MethodConfig, 1)
		mc := parsed.MethodConfig[0]
		require.Equal(t, len(names), len(mc.Name))
		require.True(t, mc.WaitForReady)
		require.Equal(t, 5, mc.RetryPolicy.MaxAttempts)
		require.Equal(t, []string{"UNAVAILABLE", "ABORTED"}, mc.RetryPolicy.Codes)
		// grpc-go parses it when the channel is made, and refuses what it
		// cannot use.
		conn, err := grpc.NewClient("passthrough:///x", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultServiceConfig(sc))
		require.NoError(t, err, sc)
		require.NoError(t, conn.Close())
	}
	for _, bad := range []string{"", "/rides.v1.Rides", "rides.v1.Rides/Create", "/a/b/c"} {
		_, err := idemgrpc.ServiceConfig(bad)
		require.Error(t, err, bad)
	}
	// No names would retry ABORTED and UNAVAILABLE on every method of the
	// channel, methods idemgrpc does not serve included, where an ABORTED
	// after an effect retried is a second effect.
	_, err := idemgrpc.ServiceConfig()
	require.ErrorContains(t, err, "name the services")
}
