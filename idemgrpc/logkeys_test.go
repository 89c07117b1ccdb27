package idemgrpc_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemgrpc"
	"github.com/go-idem/idem/internal/testfixture"
)

// Finding 4 of the security review, for idemgrpc: with the runner's
// Config.LogKeys off, none of the handler's lines about a request (the
// call's deadline passed, the runner refused it, it did not complete, its
// stored response cannot be answered), nor the runner's, names the
// caller's scope or key; a text handler writes every attribute. With
// LogKeys on, the same lines name them.
func TestLogsNoScopeOrKeyWithoutLogKeys(t *testing.T) {
	t.Parallel()
	for _, logKeys := range []bool{false, true} {
		b := setup(t)
		logs := &testfixture.Buffer{}
		runner := b.newRunner(t, b.store, func(c *idem.Config) {
			c.Logger, c.LogKeys = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), logKeys
		})
		client := serveOrders(t, b.handler(t, runner, func(c *orderConfig) { c.DeadlineMargin = 2 * time.Second }), nil)
		const user = "SECRETUSER"

		_, err, _ := callAs(t, client.CreateOrder, user, "SECRETKEY-1", orderRequest())
		require.NoError(t, err)
		_, err, _ = callAs(t, client.CreateOrder, user, "SECRETKEY-1", orderRequest())
		require.NoError(t, err)

		// A phase whose error quotes the key: not completed.
		b.setHook("charged", func(context.Context) error { return errors.New(`provider refused key "SECRETKEY-2"`) })
		_, err, _ = callAs(t, client.CreateOrder, user, "SECRETKEY-2", orderRequest())
		require.Error(t, err)
		b.setHook("charged", nil)

		// A scope the runner refuses (over 255 bytes).
		_, err, _ = callAs(t, client.CreateOrder, user+strings.Repeat("u", 300), "SECRETKEY-3", orderRequest())
		require.Error(t, err)

		// A stored response that does not decode.
		_, err = b.schema.Pool.Exec(t.Context(), `UPDATE idem_keys SET response_body = '\xffffffff' WHERE key = 'SECRETKEY-1'`)
		require.NoError(t, err)
		_, err, _ = callAs(t, client.CreateOrder, user, "SECRETKEY-1", orderRequest())
		require.Error(t, err)

		// The call's deadline passes while its request runs on.
		entered, release := b.blockPhase("charged")
		open := sync.OnceFunc(func() { close(release) })
		t.Cleanup(open)
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(t.Context(),
			"authorization", "Bearer "+user, idemgrpc.MetadataKey, "SECRETKEY-4"), 10*time.Second)
		done := make(chan error, 1)
		go func() { _, err := client.CreateOrder(ctx, orderRequest()); done <- err }()
		<-entered
		require.Error(t, <-done)
		cancel()
		open()
		for k := range b.finished { // earlier requests' finishes first
			if k == "SECRETKEY-4" {
				break
			}
		}

		for _, line := range []string{"did not finish before the call's deadline", "the runner refused the request",
			"request not completed", "stored response cannot be answered"} {
			require.Contains(t, logs.String(), line)
		}
		if logKeys {
			require.Contains(t, logs.String(), "SECRETKEY-4", "with LogKeys the lines name the key")
			require.Contains(t, logs.String(), "user:SECRETUSER")
			continue
		}
		for _, line := range strings.Split(logs.String(), "\n") {
			require.NotContains(t, line, "SECRET", "a line names the scope or key with LogKeys off")
		}
	}
}
