package idemhttp_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
	"github.com/go-idem/idem/internal/testfixture"
)

// Finding 4 of the security review, for idemhttp: with the runner's
// Config.LogKeys off, no line the handler or the runner logs names the
// caller's scope or key (a text handler writes every attribute): a new
// key, its replay, a mismatch, a failed phase whose error quotes the key,
// a call in doubt, and a request the runner refuses (a NUL in its
// target), whose line named the key. With LogKeys on, the same lines name them.
func TestHandlerLogsNoScopeOrKeyWithoutLogKeys(t *testing.T) {
	t.Parallel()
	for _, logKeys := range []bool{false, true} {
		b := setup(t, idemhttp.ProfileIETF)
		logs := &testfixture.Buffer{}
		runner := b.newRunner(t, &idem.Config{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), LogKeys: logKeys})
		h, err := idemhttp.New(runner, b.flow, b.config())
		require.NoError(t, err)
		sms, err := idemhttp.New(runner, b.sms, &idemhttp.Config[smsInput]{Scope: bearerScope})
		require.NoError(t, err)
		send := func(h http.Handler, target, key, body string) int {
			q, raw := strings.CutPrefix(target, "?raw=")
			if raw {
				target = "/rides"
			}
			r := requestTo(http.MethodPost, target, key, body)
			r.Header.Set("Authorization", "Bearer SECRETUSER")
			if raw {
				// A target the runner refuses (a NUL in the query), which
				// only a router that does not parse it lets through.
				r.URL.RawQuery = q
			}
			return serve(h, r).Code
		}

		require.Equal(t, http.StatusCreated, send(h, "/rides", "SECRETKEY-1", rideBody))
		require.Equal(t, http.StatusCreated, send(h, "/rides", "SECRETKEY-1", rideBody))
		require.Equal(t, http.StatusUnprocessableEntity, send(h, "/rides", "SECRETKEY-1", `{"origin": "SFO", "amount": 21}`))
		b.setHook("charge_created", func(_ context.Context, _ idem.Tx, run *idem.Attempt[rideInput]) error {
			return errors.New(`provider refused key "` + run.Key().Key + `"`)
		})
		require.Equal(t, http.StatusInternalServerError, send(h, "/rides", "SECRETKEY-2", rideBody))
		require.Equal(t, http.StatusServiceUnavailable, send(sms, "/sms", "SECRETKEY-3", `{"to": "+15550100"}`))
		b.setHook("charge_created", nil)
		require.Equal(t, http.StatusInternalServerError, send(h, "?raw=x=\x00", "SECRETKEY-4", rideBody))
		require.Contains(t, logs.String(), "the runner refused the request")

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

// The webhook receiver's line for an event delivered again with another
// body names neither the event id (the key) nor the scope, which carries
// the account (a Connect account id), with LogKeys off.
func TestWebhookLogsNoAccountOrEventIDWithoutLogKeys(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t)
	require.Equal(t, http.StatusOK, b.deliver(`{"id": "evt_SECRETKEY", "account": "acct_SECRETACCT", "amount": 1}`).Code)
	res := b.deliver(`{"id": "evt_SECRETKEY", "account": "acct_SECRETACCT", "amount": 2}`)
	requireWebhookProblem(t, res, http.StatusUnprocessableEntity, idemhttp.ProblemWebhookEventReused)
	require.Contains(t, b.logs.String(), "webhook event delivered again with another body")
	require.NotContains(t, b.logs.String(), "SECRET")
}
