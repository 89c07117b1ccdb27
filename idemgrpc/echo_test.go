package idemgrpc_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/go-idem/idem/idemgrpc"
	"github.com/go-idem/idem/idemgrpc/internal/testpb"
)

// echoed calls CreateOrder as alice with key in the metadata and returns
// the error and the response's header and trailer.
func echoed(t *testing.T, client testpb.OrdersClient, key string, req *testpb.CreateOrderRequest) (error, metadata.MD, metadata.MD) {
	t.Helper()
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+testUser)
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key)
	}
	var header, trailer metadata.MD
	_, err := client.CreateOrder(ctx, req, grpc.Header(&header), grpc.Trailer(&trailer))
	return err, header, trailer
}

// Every answer to a call with a valid key carries the key back (as Stripe
// echoes its Idempotency-Key, for retry code that takes the key from the
// failed answer): a response in its header, a status in its trailer, so
// that the status stays a trailers-only response, the only kind gRPC's
// retry policies retry.
func TestEveryAnswerEchoesTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client := serveOrders(t, b.handler(t, b.runner, func(c *orderConfig) { c.DefaultWait = -1 }), nil)

	// Executed, then replayed: in the header.
	err, header, _ := echoed(t, client, "k-ok", orderRequest())
	require.NoError(t, err)
	require.Equal(t, []string{"k-ok"}, header.Get(idemgrpc.MetadataKey))
	err, header, _ = echoed(t, client, "k-ok", orderRequest())
	require.NoError(t, err)
	require.True(t, replayed(header))
	require.Equal(t, []string{"k-ok"}, header.Get(idemgrpc.MetadataKey))

	// A stored status, first and replayed; a reused key; a refused request.
	declined := orderRequest()
	declined.Payment = &testpb.CreateOrderRequest_Card{Card: "declined"}
	invalid := orderRequest()
	invalid.Quantity = 0
	for _, tc := range []struct {
		name string
		key  string
		req  *testpb.CreateOrderRequest
		code codes.Code
	}{
		{"stored status", "k-declined", declined, codes.FailedPrecondition},
		{"stored status replayed", "k-declined", declined, codes.FailedPrecondition},
		{"key reused", "k-ok", declined, codes.FailedPrecondition},
		{"refused by Validate", "k-invalid", invalid, codes.InvalidArgument},
	} {
		err, header, trailer := echoed(t, client, tc.key, tc.req)
		requireStatusCode(t, err, tc.code)
		require.Equal(t, []string{tc.key}, append(header.Get(idemgrpc.MetadataKey), trailer.Get(idemgrpc.MetadataKey)...), tc.name)
	}

	// A failed phase and a key in progress: retryable statuses, in the
	// trailer of a trailers-only response (no header at all).
	b.setHook("charged", func(context.Context) error { return errors.New("provider timed out") })
	err, header, trailer := echoed(t, client, "k-failed", orderRequest())
	requireStatus(t, err, codes.Unavailable, idemgrpc.ReasonRequestFailed)
	require.Empty(t, header, "trailers-only, so that retry policies retry it")
	require.Equal(t, []string{"k-failed"}, trailer.Get(idemgrpc.MetadataKey))
	b.setHook("charged", nil)

	entered, release := b.blockPhase("charged")
	done := make(chan error, 1)
	go func() { err, _, _ := echoed(t, client, "k-busy", orderRequest()); done <- err }()
	<-entered
	err, header, trailer = echoed(t, client, "k-busy", orderRequest())
	requireStatus(t, err, codes.Aborted, idemgrpc.ReasonInProgress)
	require.Empty(t, header, "trailers-only, so that retry policies retry it")
	require.Equal(t, []string{"k-busy"}, trailer.Get(idemgrpc.MetadataKey))
	close(release)
	require.NoError(t, <-done)

	// No key, or one that is not valid: nothing to echo.
	err, header, trailer = echoed(t, client, "", orderRequest())
	requireStatus(t, err, codes.InvalidArgument, idemgrpc.ReasonKeyMissing)
	require.Empty(t, append(header.Get(idemgrpc.MetadataKey), trailer.Get(idemgrpc.MetadataKey)...))
	err, header, trailer = echoed(t, client, strings.Repeat("k", 256), orderRequest())
	requireStatus(t, err, codes.InvalidArgument, idemgrpc.ReasonKeyMalformed)
	require.Empty(t, append(header.Get(idemgrpc.MetadataKey), trailer.Get(idemgrpc.MetadataKey)...))
}

// A key the server makes up (Config.KeyOptional) is echoed too: a retry
// that sends it gets the stored answer.
func TestServerKeyIsEchoed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client := serveOrders(t, b.handler(t, b.runner, func(c *orderConfig) { c.KeyOptional = true }), nil)
	err, header, _ := echoed(t, client, "", orderRequest())
	require.NoError(t, err)
	key := header.Get(idemgrpc.MetadataKey)
	require.Len(t, key, 1)
	require.NotEmpty(t, key[0])
	err, header, _ = echoed(t, client, key[0], orderRequest())
	require.NoError(t, err)
	require.True(t, replayed(header))
	require.Equal(t, 1, b.counts.get()["charged"])
}
