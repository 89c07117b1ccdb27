package idemgrpc_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemgrpc"
	"github.com/go-idem/idem/idemgrpc/internal/testpb"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/pgstore"
)

func TestExecuteThenReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client := serveOrders(t, b.handler(t, b.runner, nil), nil)

	first, err, header := call(t, client, "k-1", orderRequest())
	require.NoError(t, err)
	require.False(t, replayed(header), "a first answer is not a replay")
	require.Equal(t, "rocket", first.GetSku())
	require.Equal(t, "ch_1", first.GetChargeId())
	require.NotZero(t, first.GetOrderId())

	for range 2 {
		again, err, header := call(t, client, "k-1", orderRequest())
		require.NoError(t, err)
		require.True(t, replayed(header), "header: %v", header)
		requireProtoEqual(t, first, again)
	}
	require.Equal(t, map[string]int{"order_created": 1, "charged": 1, "responded": 1}, b.counts.get(), "a replay runs no phase")
	require.Equal(t, 1, b.provider.count())
	require.Equal(t, 1, b.count(t, "orders"))

	row := b.keyRow(t, "k-1")
	require.Equal(t, idemtype.StoredFinished, row.Status)
	require.Equal(t, "POST", row.Method)
	require.Equal(t, testpb.Orders_CreateOrder_FullMethodName, row.Path)
	require.Equal(t, 200, row.ResponseStatus)
	require.Equal(t, `application/x-protobuf; messageType="idemgrpc.test.v1.Order"`, row.ResponseHeaders.Get("Content-Type"))
	stored := &testpb.Order{}
	require.NoError(t, proto.Unmarshal(row.ResponseBody, stored))
	requireProtoEqual(t, first, stored)
}

// The fingerprint is over the message's value: a client that serialises the
// fields in another order, or sends fields the server does not know, sends
// the same request.
func TestReplayIgnoresFieldOrderAndUnknownFields(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := serve(t, b.handler(t, b.runner, nil), nil)

	first, err, _ := call(t, testpb.NewOrdersClient(conn), "k-1", orderRequest())
	require.NoError(t, err)

	canonical, err := proto.MarshalOptions{Deterministic: true}.Marshal(orderRequest())
	require.NoError(t, err)
	shuffled := reversedFields(t, orderRequest())
	withUnknown := protowire.AppendVarint(protowire.AppendTag(append([]byte(nil), shuffled...), 99, protowire.VarintType), 7)
	require.NotEqual(t, canonical, shuffled, "the test must send other bytes than the first call")
	for _, body := range [][]byte{shuffled, withUnknown} {
		var again testpb.Order
		var header metadata.MD
		ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+testUser, idemgrpc.MetadataKey, "k-1")
		err := conn.Invoke(ctx, testpb.Orders_CreateOrder_FullMethodName, rawMessage(body), &again,
			grpc.ForceCodec(rawCodec{}), grpc.Header(&header))
		require.NoError(t, err)
		require.True(t, replayed(header))
		requireProtoEqual(t, first, &again)
	}

	// A change of value is another request.
	other := orderRequest()
	other.Labels["c"] = "4"
	_, err, _ = call(t, testpb.NewOrdersClient(conn), "k-1", other)
	requireStatus(t, err, codes.FailedPrecondition, idemgrpc.ReasonKeyReused)
	require.Equal(t, 1, b.counts.get()["order_created"])
}

// reversedFields encodes msg with its fields, and its map entries, in the
// reverse of the usual order: concatenated encodings merge, so each field is
// encoded alone and the pieces appended back to front.
func reversedFields(t *testing.T, msg proto.Message) []byte {
	t.Helper()
	var pieces [][]byte
	m := msg.ProtoReflect()
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.IsMap() {
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				one := m.New()
				one.Mutable(fd).Map().Set(k, mv)
				piece, err := proto.Marshal(one.Interface())
				require.NoError(t, err)
				pieces = append(pieces, piece)
				return true
			})
			return true
		}
		one := m.New()
		one.Set(fd, v)
		piece, err := proto.Marshal(one.Interface())
		require.NoError(t, err)
		pieces = append(pieces, piece)
		return true
	})
	var out []byte
	for i := len(pieces) - 1; i >= 0; i-- {
		out = append(out, pieces[i]...)
	}
	return out
}

// rawMessage is a request already encoded; rawCodec sends it as it is and
// decodes responses as protobuf.
type rawMessage []byte

type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	if raw, ok := v.(rawMessage); ok {
		return raw, nil
	}
	return proto.Marshal(v.(proto.Message))
}

func (rawCodec) Unmarshal(data []byte, v any) error { return proto.Unmarshal(data, v.(proto.Message)) }

func (rawCodec) Name() string { return "proto" }

// AIP-155: the key may come in a request field instead of the metadata.
func TestKeyFromRequestField(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client := serveOrders(t, b.handler(t, b.runner, func(c *orderConfig) { c.KeyField = "request_id"; c.UUIDKeys = true }), nil)
	const id = "8e03978e-40d5-43e8-bc93-6894a57f9324"
	req := orderRequest()
	req.RequestId = id

	first, err, header := call(t, client, "", req)
	require.NoError(t, err)
	require.False(t, replayed(header))
	require.NotNil(t, b.keyRow(t, id), "the field's value is the key")

	// The same key in the metadata too, or only there, is the same request.
	again, err, header := call(t, client, id, req)
	require.NoError(t, err)
	require.True(t, replayed(header))
	requireProtoEqual(t, first, again)
	again, err, header = call(t, client, id, orderRequest())
	require.NoError(t, err)
	require.True(t, replayed(header), "a key moved from the field to the metadata is the same request")
	requireProtoEqual(t, first, again)
	require.Equal(t, 1, b.counts.get()["order_created"])

	// Two different keys are refused, before anything is written.
	_, err, _ = call(t, client, "3b241101-e2bb-4255-8caf-4136c566a962", req)
	st := requireStatus(t, err, codes.InvalidArgument, idemgrpc.ReasonKeyMalformed)
	require.Contains(t, st.Message(), "different keys")

	// Not a UUID, or the nil UUID.
	for _, bad := range []string{"not-a-uuid", "00000000-0000-0000-0000-000000000000", strings.Repeat("a", 36)} {
		req := orderRequest()
		req.RequestId = bad
		_, err, _ := call(t, client, "", req)
		st := requireStatus(t, err, codes.InvalidArgument, idemgrpc.ReasonKeyMalformed)
		require.Contains(t, st.Message(), "UUID")
		requireFieldViolation(t, st, "request_id")
	}

	// Missing: the message names both places.
	_, err, _ = call(t, client, "", orderRequest())
	st = requireStatus(t, err, codes.InvalidArgument, idemgrpc.ReasonKeyMissing)
	require.Contains(t, st.Message(), `the request_id field or the "idempotency-key" metadata entry`)
	requireFieldViolation(t, st, "request_id")
	require.Equal(t, 1, b.count(t, "idem_keys"))
}

func requireFieldViolation(t *testing.T, st *status.Status, field string) {
	t.Helper()
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			require.Len(t, br.GetFieldViolations(), 1)
			require.Equal(t, field, br.GetFieldViolations()[0].GetField())
			return
		}
	}
	require.Fail(t, "no BadRequest detail", "details: %v", st.Details())
}

func TestKeyReusedForAnotherRequest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client := serveOrders(t, b.handler(t, b.runner, nil), nil)
	_, err, _ := call(t, client, "k-1", orderRequest())
	require.NoError(t, err)

	other := orderRequest()
	other.Quantity = 3
	_, err, header := call(t, client, "k-1", other)
	st := requireStatus(t, err, codes.FailedPrecondition, idemgrpc.ReasonKeyReused)
	require.False(t, replayed(header))
	var pf *errdetails.PreconditionFailure
	for _, d := range st.Details() {
		if v, ok := d.(*errdetails.PreconditionFailure); ok {
			pf = v
		}
	}
	require.NotNil(t, pf, "FAILED_PRECONDITION carries a PreconditionFailure")
	require.Equal(t, "IDEMPOTENCY_KEY", pf.GetViolations()[0].GetType())
	require.Equal(t, idemgrpc.MetadataKey, pf.GetViolations()[0].GetSubject())
	require.Equal(t, 1, b.counts.get()["order_created"], "a reused key runs nothing")
}

// A key is bound to the method it was first sent to, even when two methods
// run the same flow with the same message.
func TestKeyBoundToMethod(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cancel := b.handler(t, b.runner, func(c *orderConfig) { c.FullMethod = testpb.Orders_CancelOrder_FullMethodName })
	client := serveOrders(t, b.handler(t, b.runner, nil), cancel)

	_, err, _ := call(t, client, "k-1", orderRequest())
	require.NoError(t, err)
	_, err, _ = callAs(t, client.CancelOrder, testUser, "k-1", orderRequest())
	requireStatus(t, err, codes.FailedPrecondition, idemgrpc.ReasonKeyReused)
	require.Equal(t, 1, b.counts.get()["order_created"])
}

// The per-method handler, called from the service's own method, keeps the
// same contract as the interceptor.
func TestPerMethodHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cancel := b.handler(t, b.runner, func(c *orderConfig) { c.FullMethod = testpb.Orders_CancelOrder_FullMethodName })
	client := serveOrders(t, nil, cancel)

	first, err, header := callAs(t, client.CancelOrder, testUser, "k-1", orderRequest())
	require.NoError(t, err)
	require.False(t, replayed(header))
	again, err, header := callAs(t, client.CancelOrder, testUser, "k-1", orderRequest())
	require.NoError(t, err)
	require.True(t, replayed(header))
	requireProtoEqual(t, first, again)

	_, err, _ = callAs(t, client.CancelOrder, testUser, "", orderRequest())
	requireStatus(t, err, codes.InvalidArgument, idemgrpc.ReasonKeyMissing)
	require.Equal(t, testpb.Orders_CancelOrder_FullMethodName, b.keyRow(t, "k-1").Path)
}

func TestKeyMissingOrMalformed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		keys   []string
		reason string
		detail string
	}{
		{"missing", nil, idemgrpc.ReasonKeyMissing, `needs an idempotency key in the "idempotency-key" metadata entry`},
		{"empty", []string{""}, idemgrpc.ReasonKeyMissing, "needs an idempotency key"},
		{"too long", []string{strings.Repeat("k", 256)}, idemgrpc.ReasonKeyMalformed, "1 to 255 printable ASCII"},
		{"two keys", []string{"k-1", "k-2"}, idemgrpc.ReasonKeyMalformed, "several"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			client := serveOrders(t, b.handler(t, b.runner, nil), nil)
			ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+testUser)
			for _, k := range tc.keys {
				ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, k)
			}
			_, err := client.CreateOrder(ctx, orderRequest())
			st := requireStatus(t, err, codes.InvalidArgument, tc.reason)
			require.Contains(t, st.Message(), tc.detail)
			requireFieldViolation(t, st, idemgrpc.MetadataKey)
			b.requireNothingWritten(t)
		})
	}
	t.Run("the same key twice is one key", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		client := serveOrders(t, b.handler(t, b.runner, nil), nil)
		ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+testUser,
			idemgrpc.MetadataKey, "k-1", idemgrpc.MetadataKey, "k-1")
		_, err := client.CreateOrder(ctx, orderRequest())
		require.NoError(t, err)
		require.NotNil(t, b.keyRow(t, "k-1"))
	})
}

func TestKeyOptional(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client := serveOrders(t, b.handler(t, b.runner, func(c *orderConfig) { c.KeyOptional = true }), nil)
	first, err, _ := call(t, client, "", orderRequest())
	require.NoError(t, err)
	second, err, header := call(t, client, "", orderRequest())
	require.NoError(t, err)
	require.False(t, replayed(header), "without a key, each call is a request of its own")
	require.NotEqual(t, first.GetOrderId(), second.GetOrderId())
	require.Equal(t, 2, b.count(t, "idem_keys"))
}

// The scope comes from the caller, never from the request: the same key
// from two callers is two requests.
func TestScopeFromCaller(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client := serveOrders(t, b.handler(t, b.runner, nil), nil)

	_, err, _ := callAs(t, client.CreateOrder, "", "k-1", orderRequest())
	requireStatusCode(t, err, codes.Unauthenticated)
	b.requireNothingWritten(t)

	alice, err, _ := callAs(t, client.CreateOrder, "alice", "k-1", orderRequest())
	require.NoError(t, err)
	bob, err, header := callAs(t, client.CreateOrder, "bob", "k-1", orderRequest())
	require.NoError(t, err)
	require.False(t, replayed(header))
	require.NotEqual(t, alice.GetOrderId(), bob.GetOrderId())

	// A status error from Scope is answered as it is.
	denied := b.handler(t, b.runner, func(c *orderConfig) {
		c.Scope = func(context.Context) (string, error) { return "", status.Error(codes.PermissionDenied, "not yours") }
	})
	_, err, _ = call(t, serveOrders(t, denied, nil), "k-2", orderRequest())
	requireStatusCode(t, err, codes.PermissionDenied)

	// Scopes that start with "webhook:" belong to idemhttp's webhook
	// receivers: a call cannot take an event's key.
	reserved := b.handler(t, b.runner, func(c *orderConfig) {
		c.Scope = func(context.Context) (string, error) { return "webhook:stripe", nil }
	})
	_, err, _ = call(t, serveOrders(t, reserved, nil), "evt_1", orderRequest())
	requireStatusCode(t, err, codes.Internal)
	require.Zero(t, b.count(t, "idem_keys WHERE scope LIKE 'webhook:%'"))
}

func requireStatusCode(t *testing.T, err error, c codes.Code) *status.Status {
	t.Helper()
	st, ok := status.FromError(err)
	require.True(t, ok, "not a status error: %v", err)
	require.Equal(t, c, st.Code(), "message: %s", st.Message())
	return st
}

func TestValidate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client := serveOrders(t, b.handler(t, b.runner, nil), nil)

	req := orderRequest()
	req.Sku = ""
	_, err, _ := call(t, client, "k-1", req)
	st := requireStatusCode(t, err, codes.InvalidArgument)
	require.Equal(t, "sku is required", st.Message())
	requireFieldViolation(t, st, "sku")

	req = orderRequest()
	req.Quantity = 0
	_, err, _ = call(t, client, "k-1", req)
	st = requireStatusCode(t, err, codes.InvalidArgument)
	require.Equal(t, "quantity must be positive", st.Message())
	b.requireNothingWritten(t)

	// What the key store cannot keep is refused too, before any phase runs.
	req = orderRequest()
	req.Sku = "nul\x00"
	_, err, _ = call(t, client, "k-1", req)
	requireStatus(t, err, codes.InvalidArgument, idemgrpc.ReasonInvalidRequest)
	b.requireNothingWritten(t)
}

// Without a wait (DefaultWait negative), a call that finds its key in
// flight is answered ABORTED at once.
func TestInProgress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client := serveOrders(t, b.handler(t, b.runner, func(c *orderConfig) { c.DefaultWait = -1 }), nil)
	entered, release := b.blockPhase("charged")

	type answer struct {
		order *testpb.Order
		err   error
	}
	done := make(chan answer, 1)
	go func() {
		order, err, _ := call(t, client, "k-1", orderRequest())
		done <- answer{order, err}
	}()
	<-entered

	var header, trailer metadata.MD
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+testUser, idemgrpc.MetadataKey, "k-1")
	_, err := client.CreateOrder(ctx, orderRequest(), grpc.Header(&header), grpc.Trailer(&trailer))
	st := requireStatus(t, err, codes.Aborted, idemgrpc.ReasonInProgress)
	require.False(t, replayed(header))
	delay, ok := retryDelay(st)
	require.True(t, ok, "ABORTED carries RetryInfo")
	require.GreaterOrEqual(t, delay, time.Second)
	require.LessOrEqual(t, delay, b.runner.Config().MaxRetryAfter)
	require.Equal(t, []string{strconv.FormatInt(delay.Milliseconds(), 10)}, trailer.Get(idemgrpc.PushbackTrailer),
		"the delay goes to gRPC's retry policies too")

	close(release)
	first := <-done
	require.NoError(t, first.err)
	again, err, header := call(t, client, "k-1", orderRequest())
	require.NoError(t, err)
	require.True(t, replayed(header))
	requireProtoEqual(t, first.order, again)
	require.Equal(t, 1, b.counts.get()["charged"])
}

// A new key commits, leased, before its first phase runs: a duplicate
// during that phase is ABORTED at once, with RetryInfo from the lease
// (capped by the runner's MaxRetryAfter, 2 s), and another request under
// the key is refused as reused then as at every moment. (Without the
// server's default wait: with it, the duplicate would wait for the first.)
func TestInProgressDuringTheFirstPhase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client := serveOrders(t, b.handler(t, b.runner, func(c *orderConfig) { c.DefaultWait = -1 }), nil)
	entered, release := b.blockPhase("order_created")
	open := sync.OnceFunc(func() { close(release) })
	t.Cleanup(open) // a failing require must not leave the first call blocked
	done := make(chan error, 1)
	go func() {
		_, err, _ := call(t, client, "k-1", orderRequest())
		done <- err
	}()
	<-entered

	_, err, header := call(t, client, "k-1", orderRequest())
	st := requireStatus(t, err, codes.Aborted, idemgrpc.ReasonInProgress)
	require.False(t, replayed(header))
	delay, ok := retryDelay(st)
	require.True(t, ok, "ABORTED carries RetryInfo")
	require.Equal(t, 2*time.Second, delay)
	other := orderRequest()
	other.Quantity = 3
	_, err, _ = call(t, client, "k-1", other)
	requireStatus(t, err, codes.FailedPrecondition, idemgrpc.ReasonKeyReused)
	open()
	require.NoError(t, <-done)
	require.Equal(t, map[string]int{"order_created": 1, "charged": 1, "responded": 1}, b.counts.get())
}

// A phase that answers with an error status stores it: every retry gets the
// same code, message and details, marked as a replay.
func TestStoredErrorStatusIsReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client := serveOrders(t, b.handler(t, b.runner, nil), nil)
	req := orderRequest()
	req.Payment = &testpb.CreateOrderRequest_Card{Card: "declined"}

	_, err, header := call(t, client, "k-1", req)
	first := requireStatus(t, err, codes.FailedPrecondition, "CARD_DECLINED")
	require.Equal(t, "The card was declined.", first.Message())
	require.False(t, replayed(header))

	_, err, header = call(t, client, "k-1", req)
	again := requireStatus(t, err, codes.FailedPrecondition, "CARD_DECLINED")
	require.True(t, replayed(header), "a replayed status carries the header too: %v", header)
	requireProtoEqual(t, first.Proto(), again.Proto())

	require.Equal(t, map[string]int{"order_created": 1, "charged": 1}, b.counts.get())
	require.Zero(t, b.provider.count())
	row := b.keyRow(t, "k-1")
	require.Equal(t, idemtype.StoredFinished, row.Status)
	require.Equal(t, 400, row.ResponseStatus, "the stored HTTP status is FAILED_PRECONDITION's")
	require.Equal(t, `application/x-protobuf; messageType="google.rpc.Status"`, row.ResponseHeaders.Get("Content-Type"))
}

func TestStoreUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t)

	// Down: nothing listens. Stalled: a server that accepts connections and
	// never answers; the pool's connect_timeout gives up on it.
	stalled, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = stalled.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			c, err := stalled.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()

	for name, addr := range map[string]string{"down": "127.0.0.1:1", "stalled": stalled.Addr().String()} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool, err := pgxpool.New(context.Background(), "postgres://postgres@"+addr+"/none?sslmode=disable&connect_timeout=1")
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			store, err := pgstore.New(pool, nil)
			require.NoError(t, err)
			t.Cleanup(store.Close)
			client := serveOrders(t, b.handler(t, b.newRunner(t, store), nil), nil)

			_, err, header := call(t, client, "k-1", orderRequest())
			st := requireStatusCode(t, err, codes.Unavailable)
			require.False(t, replayed(header))
			delay, ok := retryDelay(st)
			require.True(t, ok, "UNAVAILABLE carries RetryInfo")
			switch reason := errorInfo(st).GetReason(); name {
			case "down":
				require.Equal(t, idemgrpc.ReasonStoreUnavailable, reason)
				require.Equal(t, idemgrpc.DefaultUnavailableRetryDelay, delay)
			case "stalled":
				// pgstore reports a connect that timed out as a failed
				// acquisition rather than an unavailable store (it reads the
				// deadline as the caller's): UNAVAILABLE all the same, as a
				// failed request.
				require.Contains(t, []string{idemgrpc.ReasonStoreUnavailable, idemgrpc.ReasonRequestFailed}, reason)
			}
			require.Empty(t, b.counts.get(), "no phase may run when the store is unreachable")
		})
	}
}

func TestPhaseFailureIsRetryable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		fail   func() error
		code   codes.Code
		retry  bool
		reason string
	}{
		{"error", func() error { return errors.New("provider timed out") }, codes.Unavailable, true, idemgrpc.ReasonRequestFailed},
		{"panic", func() error { panic("nil map in the charge phase") }, codes.Internal, false, idemgrpc.ReasonRequestFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			client := serveOrders(t, b.handler(t, b.runner, nil), nil)
			b.setHook("charged", func(context.Context) error { return tc.fail() })

			_, err, _ := call(t, client, "k-1", orderRequest())
			st := requireStatus(t, err, tc.code, tc.reason)
			require.NotContains(t, st.Message(), "provider timed out", "a phase's error is logged, never sent")
			delay, ok := retryDelay(st)
			require.Equal(t, tc.retry, ok)
			if ok {
				require.Equal(t, idemgrpc.DefaultFailedRetryDelay, delay)
			}
			row := b.keyRow(t, "k-1")
			require.Equal(t, "order_created", row.RecoveryPoint)
			require.Nil(t, row.LockedAt, "the key is released for the retry")

			b.setHook("charged", nil)
			order, err, header := call(t, client, "k-1", orderRequest())
			require.NoError(t, err)
			require.False(t, replayed(header), "the retry resumed and executed")
			require.Equal(t, map[string]int{"order_created": 1, "charged": 2, "responded": 1}, b.counts.get())
			require.Equal(t, "ch_1", order.GetChargeId())
		})
	}
}

// A client that gives up does not stop its request half-way: the flow runs
// to its end, and the retry replays.
func TestClientGivingUpDoesNotStopTheFlow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client := serveOrders(t, b.handler(t, b.runner, nil), nil)
	entered, release := b.blockPhase("charged")

	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(t.Context(),
		"authorization", "Bearer "+testUser, idemgrpc.MetadataKey, "k-1"))
	gaveUp := make(chan error, 1)
	go func() {
		_, err := client.CreateOrder(ctx, orderRequest())
		gaveUp <- err
	}()
	<-entered
	cancel()
	requireStatusCode(t, <-gaveUp, codes.Canceled)
	close(release)
	require.Equal(t, "k-1", <-b.finished)

	order, err, header := call(t, client, "k-1", orderRequest())
	require.NoError(t, err)
	require.True(t, replayed(header))
	require.Equal(t, "ch_1", order.GetChargeId())
	require.Equal(t, map[string]int{"order_created": 1, "charged": 1, "responded": 1}, b.counts.get())
}

func TestOtherMethodsPassThrough(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := serve(t, b.handler(t, b.runner, nil), nil)
	resp, err := testpb.NewOrdersClient(conn).Ping(t.Context(), &testpb.PingRequest{Text: "hi"})
	require.NoError(t, err)
	require.Equal(t, "pong: hi", resp.GetText())
	require.Zero(t, b.count(t, "idem_keys"))
}

// A flow that responds with something other than the method's response
// message (here JSON whose members are not its fields) is a server bug:
// INTERNAL, and it is logged.
func TestWrongResponseIsInternal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	flow := idem.MustNewFlow("orders.json", []idem.Phase[orderInput]{{
		Name: "responded",
		Do: func(context.Context, phaseTx, *idem.Attempt[orderInput]) (idem.Result, error) {
			return idem.RespondJSON(200, map[string]string{"not": "protobuf"}), nil
		},
	}}, nil)
	h, err := idemgrpc.New(b.newRunner(t, b.store, func(c *idem.Config) { c.Flows = append(c.Flows, flow) }), flow, b.config())
	require.NoError(t, err)
	_, err, _ = call(t, serveOrders(t, h, nil), "k-1", orderRequest())
	requireStatus(t, err, codes.Internal, idemgrpc.ReasonInternal)
}

// stallingStore is a store whose acquisitions wait until the gate opens:
// the database is reachable but does not answer.
type stallingStore struct {
	*pgstore.Store
	gate chan struct{}
}

func (s *stallingStore) Acquire(ctx context.Context, p idemdriver.AcquireParams) (*idemdriver.AcquireResult, error) {
	<-s.gate
	return s.Store.Acquire(ctx, p)
}

// A store that stalls on a live connection never answers, and nothing in
// the database times out: the call answers UNAVAILABLE with RetryInfo before
// its deadline, the request goes on when the store does, and the retry gets
// its answer.
func TestStoreStallsBeforeTheDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stalled := &stallingStore{Store: b.store, gate: make(chan struct{})}
	// Margins generous enough for a loaded machine: the answer must leave
	// the server well before the client gives up on the call, and the
	// acquisition, once the store answers, must still be within its own
	// statement timeout.
	runner := b.newRunner(t, stalled, func(c *idem.Config) { c.StatementTimeout = time.Minute })
	client := serveOrders(t, b.handler(t, runner, func(c *orderConfig) {
		c.DeadlineMargin = 3 * time.Second
	}), nil)

	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(t.Context(),
		"authorization", "Bearer "+testUser, idemgrpc.MetadataKey, "k-1"), 10*time.Second)
	defer cancel()
	_, err := client.CreateOrder(ctx, orderRequest())
	st := requireStatus(t, err, codes.Unavailable, idemgrpc.ReasonUnfinished)
	delay, ok := retryDelay(st)
	require.True(t, ok, "UNAVAILABLE carries RetryInfo")
	require.Equal(t, idemgrpc.DefaultFailedRetryDelay, delay)
	require.Empty(t, b.counts.get())

	close(stalled.gate)
	require.Equal(t, "k-1", <-b.finished, "the request runs on when the store answers")
	order, err, header := call(t, client, "k-1", orderRequest())
	require.NoError(t, err)
	require.True(t, replayed(header))
	require.Equal(t, "ch_1", order.GetChargeId())
	require.Equal(t, map[string]int{"order_created": 1, "charged": 1, "responded": 1}, b.counts.get())
}

// gRPC's own retry policy, configured on the client's channel, retries an
// in-progress key after the server's pushback and gets the answer: no
// hand-written retry loop needed.
func TestBuiltInRetryPolicy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := serve(t, b.handler(t, b.runner, nil), nil, grpc.WithDefaultServiceConfig(`{"methodConfig": [{
		"name": [{"service": "idemgrpc.test.v1.Orders"}],
		"retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
		                "retryableStatusCodes": ["UNAVAILABLE", "ABORTED"]}}]}`))
	client := testpb.NewOrdersClient(conn)
	entered, release := b.blockPhase("charged")

	first := make(chan error, 1)
	go func() {
		_, err, _ := call(t, client, "k-1", orderRequest())
		first <- err
	}()
	<-entered
	type answer struct {
		order *testpb.Order
		err   error
	}
	second := make(chan answer, 1)
	go func() {
		order, err, _ := call(t, client, "k-1", orderRequest())
		second <- answer{order, err}
	}()
	require.Equal(t, "k-1", <-b.inProgress, "the second call's first attempt found the key in progress")
	close(release)
	require.NoError(t, <-first)
	got := <-second
	require.NoError(t, got.err, "the channel retries ABORTED until the stored answer")
	require.Equal(t, "ch_1", got.order.GetChargeId())
	require.Equal(t, 1, b.counts.get()["charged"])
}

// The fingerprint is over the message the client sent (its deterministic
// wire encoding) and the method, not over the flow's input: a deploy that
// changes what Config.Input derives from the request leaves a retry's
// fingerprint as it was, and a retry is replayed, not refused as a reused
// key. Another message is still another request.
func TestRetryAcrossDeployThatChangesTheInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	before := serveOrders(t, b.handler(t, b.runner, nil), nil)
	first, err, _ := call(t, before, "k-1", orderRequest())
	require.NoError(t, err)

	wire, err := proto.MarshalOptions{Deterministic: true}.Marshal(orderRequest())
	require.NoError(t, err)
	sum := sha256.Sum256(append([]byte("orders.create\x00"+testpb.Orders_CreateOrder_FullMethodName+"\x00b"), wire...))
	require.Equal(t, append([]byte{2}, sum[:]...), b.keyRow(t, "k-1").Fingerprint, "scheme 2 over the wire bytes")

	after := serveOrders(t, b.handler(t, b.runner, func(c *orderConfig) {
		c.Input = func(_ context.Context, req *testpb.CreateOrderRequest) (orderInput, error) {
			m := proto.CloneOf(req)
			m.Notes = append(m.Notes, "derived by the new release")
			return orderInput{Method: testpb.Orders_CreateOrder_FullMethodName, Message: m}, nil
		}
	}), nil)
	again, err, header := call(t, after, "k-1", orderRequest())
	require.NoError(t, err)
	require.True(t, replayed(header))
	requireProtoEqual(t, first, again)
	t.Logf("after a deploy that changed Config.Input: replayed=%v", replayed(header))

	other := orderRequest()
	other.Quantity++
	_, err, _ = call(t, after, "k-1", other)
	requireStatus(t, err, codes.FailedPrecondition, idemgrpc.ReasonKeyReused)
	require.Equal(t, 1, b.counts.get()["order_created"])
}

// By default (Config.DefaultWait), a call for a key in flight waits for it
// and gets its stored answer; TestInProgress shows the ABORTED it gets at
// once without a wait.
func TestWaitForInProgress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The database's clock, not the bundle's test clock: a waiter checks
	// leases by it.
	runner := b.newRunner(t, b.store, func(c *idem.Config) { c.Test.Now = nil })
	client := serveOrders(t, b.handler(t, runner, nil), nil)
	entered, release := b.blockPhase("charged")
	open := sync.OnceFunc(func() { close(release) })
	t.Cleanup(open) // a failing test must not leave the phase blocked

	type answer struct {
		order  *testpb.Order
		err    error
		header metadata.MD
	}
	first := make(chan answer, 1)
	go func() {
		order, err, header := call(t, client, "k-1", orderRequest())
		first <- answer{order, err, header}
	}()
	<-entered

	waiter := make(chan answer, 1)
	go func() {
		order, err, header := call(t, client, "k-1", orderRequest())
		waiter <- answer{order, err, header}
	}()
	select {
	case <-b.inProgress:
	case <-time.After(time.Minute):
		t.Fatal("the second call never found the key in progress")
	}
	open()
	one, two := <-first, <-waiter
	require.NoError(t, one.err)
	require.NoError(t, two.err)
	require.True(t, replayed(two.header))
	requireProtoEqual(t, one.order, two.order)
	require.Equal(t, 1, b.counts.get()["charged"])
}

// A call whose deadline comes before the attempt in flight ends gets
// ABORTED, not DEADLINE_EXCEEDED.
func TestWaitEndsBeforeTheDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runner := b.newRunner(t, b.store, func(c *idem.Config) { c.Test.Now = nil })
	client := serveOrders(t, b.handler(t, runner, func(c *orderConfig) { c.DefaultWait = time.Minute }), nil)
	entered, release := b.blockPhase("charged")
	open := sync.OnceFunc(func() { close(release) })
	t.Cleanup(open) // a failing test must not leave the phase blocked
	done := make(chan error, 1)
	go func() { _, err, _ := call(t, client, "k-1", orderRequest()); done <- err }()
	<-entered

	// Long enough that a loaded machine still acquires the key well
	// within it, before the handler's own margin answers REQUEST_UNFINISHED.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testUser, idemgrpc.MetadataKey, "k-1")
	began := time.Now()
	_, err := client.CreateOrder(ctx, orderRequest())
	requireStatus(t, err, codes.Aborted, idemgrpc.ReasonInProgress)
	require.GreaterOrEqual(t, time.Since(began), time.Second, "it waited")

	// MaxWait caps DefaultWait: a call without a deadline waits a second,
	// not an hour.
	capped := serveOrders(t, b.handler(t, runner, func(c *orderConfig) { c.DefaultWait, c.MaxWait = time.Hour, time.Second }), nil)
	began = time.Now()
	_, err, _ = call(t, capped, "k-1", orderRequest())
	requireStatus(t, err, codes.Aborted, idemgrpc.ReasonInProgress)
	require.GreaterOrEqual(t, time.Since(began), time.Second, "it waited")
	open()
	require.NoError(t, <-done)
}

// requestEnds is an Observer whose Tracer reports each request's end.
type requestEnds struct {
	idem.Observer
	ended chan error
}

func (r requestEnds) StartRequest(ctx context.Context, _, _ string) (context.Context, func(*idem.Outcome, error)) {
	return ctx, func(_ *idem.Outcome, err error) { r.ended <- err }
}

func (requestEnds) StartPhase(ctx context.Context, _, _ string, _ int) (context.Context, func(error)) {
	return ctx, func(error) {}
}

// A call that is cancelled while it waits stops waiting at once: its
// request ends (in progress), rather than holding a goroutine for
// DefaultWait.
// The call in flight is untouched.
func TestWaitEndsWithTheCall(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ends := make(chan error, 4)
	runner := b.newRunner(t, b.store, func(c *idem.Config) {
		c.Test.Now = nil
		c.Observer = requestEnds{Observer: c.Observer, ended: ends}
	})
	client := serveOrders(t, b.handler(t, runner, func(c *orderConfig) { c.DefaultWait = time.Hour }), nil)
	entered, release := b.blockPhase("charged")
	open := sync.OnceFunc(func() { close(release) })
	t.Cleanup(open)
	done := make(chan error, 1)
	go func() { _, err, _ := call(t, client, "k-1", orderRequest()); done <- err }()
	<-entered

	ctx, cancel := context.WithCancel(t.Context())
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testUser, idemgrpc.MetadataKey, "k-1")
	waiter := make(chan error, 1)
	go func() { _, err := client.CreateOrder(ctx, orderRequest()); waiter <- err }()
	<-b.inProgress
	cancel()
	requireStatusCode(t, <-waiter, codes.Canceled)
	require.ErrorIs(t, <-ends, idem.ErrInProgress, "the waiting request ended, without waiting the hour")
	open()
	require.NoError(t, <-done)
}
