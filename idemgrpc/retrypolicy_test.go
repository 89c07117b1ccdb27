package idemgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/go-idem/idem/idemgrpc"
	"github.com/go-idem/idem/idemgrpc/internal/testpb"
	"github.com/go-idem/idem/internal/testfixture"
)

// A call whose deadline is too short for the request (here a provider that
// hangs) gets the server's UNAVAILABLE with REQUEST_UNFINISHED and its
// RetryInfo, through grpc-go's own retry policy over a real connection: the
// server's pushback says not to retry within the call (there is no time
// left for the delay RetryInfo asks), so grpc-go hands the status back
// rather than sleeping past the deadline and answering DEADLINE_EXCEEDED.
func TestShortDeadlineGetsTheStatusNotDeadlineExceeded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hang := make(chan struct{})
	open := sync.OnceFunc(func() { close(hang) })
	t.Cleanup(open)
	b.setHook("charged", func(context.Context) error { <-hang; return nil })
	sc, err := idemgrpc.ServiceConfig("idemgrpc.test.v1.Orders")
	require.NoError(t, err)
	client := testpb.NewOrdersClient(serveTCP(t, b.handler(t, b.runner, nil), grpc.WithDefaultServiceConfig(sc)))

	const calls = 12
	type answer struct {
		err     error
		trailer metadata.MD
	}
	answers := make(chan answer, calls)
	for i := range calls {
		go func() {
			ctx, cancel := context.WithTimeout(t.Context(), 800*time.Millisecond)
			defer cancel()
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testUser, idemgrpc.MetadataKey, fmt.Sprintf("k-%d", i))
			var trailer metadata.MD
			_, err := client.CreateOrder(ctx, orderRequest(), grpc.Trailer(&trailer))
			answers <- answer{err, trailer}
		}()
	}
	unfinished := 0
	for range calls {
		a := <-answers
		st := requireStatusCode(t, a.err, codes.Unavailable)
		require.Equal(t, idemgrpc.ReasonUnfinished, errorInfo(st).GetReason(), "message: %s", st.Message())
		delay, ok := retryDelay(st)
		require.True(t, ok, "the status keeps its RetryInfo")
		require.Equal(t, idemgrpc.DefaultFailedRetryDelay, delay)
		require.Equal(t, []string{"-1"}, a.trailer.Get(idemgrpc.PushbackTrailer), "a pushback that says: do not retry within this call")
		unfinished++
	}
	t.Logf("800 ms deadline, provider hanging: %d of %d calls got UNAVAILABLE/%s with RetryInfo %s", unfinished, calls,
		idemgrpc.ReasonUnfinished, idemgrpc.DefaultFailedRetryDelay)

	// The requests ran on: once the provider answers, a retry with a
	// fresh deadline gets each one's answer.
	open()
	for i := range calls {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+testUser, idemgrpc.MetadataKey, fmt.Sprintf("k-%d", i))
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		order, err := client.CreateOrder(ctx, orderRequest())
		cancel()
		require.NoError(t, err)
		require.NotEmpty(t, order.GetChargeId())
	}
	require.Equal(t, calls, b.counts.get()["charged"])
}

// An interceptor of the service's that sets a response header (a request
// id, say) turns grpc-go's retries off: a status that follows headers is
// final for the channel (gRFC A6 retries trailers-only responses only), so
// a phase failure the channel retries without the header reaches the
// caller with it. idemgrpc logs it, at warn once per method.
func TestResponseHeaderTurnsRetriesOff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc, err := idemgrpc.ServiceConfig("idemgrpc.test.v1.Orders")
	require.NoError(t, err)
	requestID := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		_ = grpc.SetHeader(ctx, metadata.Pairs("x-request-id", "r-1"))
		return handler(ctx, req)
	}
	// The first charge of each call fails; a retry resumes and succeeds.
	var failNext atomic.Bool
	b.setHook("charged", func(context.Context) error {
		if failNext.CompareAndSwap(true, false) {
			return errors.New("card network timed out")
		}
		return nil
	})

	const calls = 4
	run := func(name string, other grpc.UnaryServerInterceptor) (failed int, logs string) {
		var buf testfixture.Buffer
		h := b.handler(t, b.runner, func(c *orderConfig) {
			c.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
		})
		client := testpb.NewOrdersClient(serveTCPAfter(t, other, h, grpc.WithDefaultServiceConfig(sc)))
		for i := range calls {
			failNext.Store(true)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testUser, idemgrpc.MetadataKey, fmt.Sprintf("%s-%d", name, i))
			_, err := client.CreateOrder(ctx, orderRequest())
			cancel()
			if err != nil {
				requireStatus(t, err, codes.Unavailable, idemgrpc.ReasonRequestFailed)
				failed++
			}
		}
		return failed, buf.String()
	}

	failed, logs := run("plain", nil)
	require.Zero(t, failed, "the channel retries every failed phase")
	require.NotContains(t, logs, "goes out after response headers")
	withHeader, logs := run("header", requestID)
	require.Equal(t, calls, withHeader, "with a header, the channel retries none")
	require.Equal(t, 1, strings.Count(logs, "level=WARN msg=\"idemgrpc: a status that invites a retry goes out after response headers"), logs)
	require.Contains(t, logs, "headers=[x-request-id]")
	t.Logf("a phase failure on each call, retried by grpc-go's retry policy: %d of %d calls failed; with a response header set by another interceptor: %d of %d",
		failed, calls, withHeader, calls)
}

// The pushback is RetryInfo's delay when a retry after it can still be
// answered within the call's deadline, -1 when it cannot, and the delay
// for a call without a deadline; RetryInfo itself is the same in all three.
func TestPushbackWithinTheDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client := serveOrders(t, b.handler(t, b.runner, func(c *orderConfig) { c.DefaultWait = -1 }), nil)
	entered, release := b.blockPhase("charged")
	open := sync.OnceFunc(func() { close(release) })
	t.Cleanup(open)
	done := make(chan error, 1)
	go func() { _, err, _ := call(t, client, "k-1", orderRequest()); done <- err }()
	<-entered

	for _, tc := range []struct {
		name     string
		deadline time.Duration // 0: none
		fits     bool
	}{
		{"no deadline", 0, true},
		{"a minute", time.Minute, true},
		// RetryInfo asks 1 to 2 s; a retry then needs twice the 250 ms
		// margin: 1.5 s leaves no time.
		{"1.5 s", 1500 * time.Millisecond, false},
	} {
		ctx := t.Context()
		if tc.deadline > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, tc.deadline)
			defer cancel()
		}
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testUser, idemgrpc.MetadataKey, "k-1")
		var trailer metadata.MD
		_, err := client.CreateOrder(ctx, orderRequest(), grpc.Trailer(&trailer))
		st := requireStatus(t, err, codes.Aborted, idemgrpc.ReasonInProgress)
		delay, ok := retryDelay(st)
		require.True(t, ok, tc.name)
		want := strconv.FormatInt(delay.Milliseconds(), 10)
		if !tc.fits {
			want = "-1"
		}
		require.Equal(t, []string{want}, trailer.Get(idemgrpc.PushbackTrailer), tc.name)
	}
	open()
	require.NoError(t, <-done)
}
