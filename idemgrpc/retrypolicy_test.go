package idemgrpc_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/go-idem/idem/idemgrpc"
	"github.com/go-idem/idem/idemgrpc/internal/testpb"
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
