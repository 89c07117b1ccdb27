package idemhttp_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
	"github.com/go-idem/idem/pgstore"
)

// Every answer to a request with a valid Idempotency-Key carries that key
// back, as the client sent it, in both profiles: Stripe's convention, which
// its SDKs read into the failed call's response, so that application code
// retrying a failed call reuses the key rather than making a new one (and
// a second charge beside the one the completer finishes).
func TestEveryAnswerCarriesTheKey(t *testing.T) {
	t.Parallel()
	for _, profile := range []idemhttp.Profile{idemhttp.ProfileIETF, idemhttp.ProfileStripe} {
		t.Run(profile.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, profile)
			h := b.handler(t, nil)
			sms, err := idemhttp.New(b.runner, b.sms, &idemhttp.Config[smsInput]{Scope: bearerScope, Profile: profile})
			require.NoError(t, err)

			echoes := func(name string, res *httptest.ResponseRecorder, status int, key string) {
				t.Helper()
				require.Equal(t, status, res.Code, "%s: %s", name, res.Body)
				require.Equal(t, []string{key}, res.Header().Values("Idempotency-Key"), name)
			}
			echoes("executed", post(h, "k-1", rideBody), http.StatusCreated, "k-1")
			replay := post(h, "k-1", rideBody)
			echoes("replayed", replay, http.StatusCreated, "k-1")
			require.Equal(t, "true", replay.Header().Get("Idempotent-Replayed"))
			echoes("quoted key, echoed as sent", post(h, `"k-1"`, rideBody), http.StatusCreated, `"k-1"`)

			reused := http.StatusUnprocessableEntity
			invalid := http.StatusUnprocessableEntity
			if profile == idemhttp.ProfileStripe {
				reused, invalid = http.StatusBadRequest, http.StatusBadRequest
			}
			echoes("reused", post(h, "k-1", `{"origin": "SFO", "amount": 21}`), reused, "k-1")
			echoes("invalid input", post(h, "k-2", `{"amount": -3}`), invalid, "k-2")
			echoes("malformed JSON", post(h, "k-2", `{"origin"`), http.StatusBadRequest, "k-2")
			small := b.handler(t, func(c *idemhttp.Config[rideInput]) { c.MaxBodyBytes = 8 })
			echoes("too large", post(small, "k-2", rideBody), http.StatusRequestEntityTooLarge, "k-2")
			form := request("k-2", "origin=SFO")
			form.Header.Set("Content-Type", "text/plain")
			echoes("unsupported media type", serve(h, form), http.StatusUnsupportedMediaType, "k-2")
			anonymous := request("k-2", rideBody)
			anonymous.Header.Del("Authorization")
			echoes("unauthenticated", serve(h, anonymous), http.StatusUnauthorized, "k-2")

			// A phase fails: 500.
			b.failOnce("charge_created", func() error { return errors.New("provider timed out") })
			echoes("failed", post(h, "k-3", rideBody), http.StatusInternalServerError, "k-3")

			// In progress: 409 (429 in the Stripe profile once the wait
			// runs out).
			entered, release := b.blockPhase(t, "responded")
			first := make(chan *httptest.ResponseRecorder, 1)
			go func() { first <- post(h, "k-4", rideBody) }()
			<-entered
			inProgress := post(h, "k-4", rideBody)
			require.Contains(t, []int{http.StatusConflict, http.StatusTooManyRequests}, inProgress.Code, inProgress.Body.String())
			require.Equal(t, []string{"k-4"}, inProgress.Header().Values("Idempotency-Key"))
			release()
			echoes("the held request", <-first, http.StatusCreated, "k-4")

			// Parked for reconciliation: 503; abandoned by an operator: 410.
			echoes("needs reconcile", post(sms, "s-1", `{"to": "+15550100"}`), http.StatusServiceUnavailable, "s-1")
			echoes("needs reconcile, again", post(sms, "s-1", `{"to": "+15550100"}`), http.StatusServiceUnavailable, "s-1")
			_, err = b.runner.Resolve(context.Background(), testScope, "s-1",
				idem.Resolution{Verdict: idem.ResolveAbandon, Operator: "alice", Reason: "INC-42: refunded by hand"})
			require.NoError(t, err)
			echoes("abandoned", post(sms, "s-1", `{"to": "+15550100"}`), http.StatusGone, "s-1")

			// The key store is unreachable: 503.
			echoes("store unavailable", post(b.handlerOn(t, b.unreachableRunner(t), b.flow, nil), "k-5", rideBody),
				http.StatusServiceUnavailable, "k-5")

			// A request without a valid key has none to carry back.
			strict := b.handler(t, func(c *idemhttp.Config[rideInput]) { c.MinKeyLength = 16 })
			for name, res := range map[string]*httptest.ResponseRecorder{
				"missing":   post(h, "", rideBody),
				"malformed": post(h, "k\x01", rideBody),
				"too short": post(strict, "k-6", rideBody),
				"too many":  serve(h, func() *http.Request { r := request("a", rideBody); r.Header.Add("Idempotency-Key", "b"); return r }()),
			} {
				require.Equal(t, http.StatusBadRequest, res.Code, name)
				require.Empty(t, res.Header().Values("Idempotency-Key"), name)
			}
		})
	}
}

// unreachableRunner is a runner of the bundle's rides flow on a store whose
// database does not answer.
func (b *bundle) unreachableRunner(t testing.TB) *idem.Runner {
	t.Helper()
	cfg, err := pgxpool.ParseConfig("postgres://postgres@127.0.0.1:1/none?connect_timeout=2")
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	deadStore, err := pgstore.New(pool, nil)
	require.NoError(t, err)
	t.Cleanup(deadStore.Close)
	dead, err := idem.NewRunner(deadStore, &idem.Config{Flows: []idem.AnyFlow{b.flow}})
	require.NoError(t, err)
	return dead
}
