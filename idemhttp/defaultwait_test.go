package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
)

// heldKey starts a request with key and holds it in charge_created, with
// its lease, until release; done yields its response.
func heldKey(t *testing.T, b *bundle, h http.Handler, key string) (release func(), done <-chan *httptest.ResponseRecorder) {
	t.Helper()
	entered, release := b.blockPhase(t, "charge_created")
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- post(h, key, rideBody) }()
	<-entered
	return release, first
}

// waitingOn reports when a request waits on the key in flight: its watch
// marked the key's lease.
func (b *bundle) waitingOn(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		var marked bool
		err := b.pool.QueryRow(context.Background(), `SELECT waited_at IS NOT NULL FROM idem_leases`).Scan(&marked)
		return err == nil && marked
	}, time.Minute, 5*time.Millisecond)
}

// A stock client sends no Prefer: by default its retry waits for the
// attempt in flight and gets its answer, replayed, instead of a 409 it
// would take as final. Nobody asked to wait, so nothing says a preference
// was applied.
func TestDefaultWaitAnswersTheRetry(t *testing.T) {
	t.Parallel()
	for _, profile := range []idemhttp.Profile{idemhttp.ProfileIETF, idemhttp.ProfileStripe} {
		t.Run(profile.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, profile)
			b.runner = b.newRunner(t, &idem.Config{Test: idem.TestConfig{Now: time.Now}})
			h := b.handler(t, func(c *idemhttp.Config[rideInput]) { c.DefaultWait = 0 }) // the default
			release, first := heldKey(t, b, h, "k-1")

			retry := make(chan *httptest.ResponseRecorder, 1)
			go func() { retry <- post(h, "k-1", rideBody) }()
			b.waitingOn(t)
			release()
			require.Equal(t, http.StatusCreated, (<-first).Code)
			res := <-retry
			require.Equal(t, http.StatusCreated, res.Code, res.Body.String())
			require.Equal(t, "true", res.Header().Get("Idempotent-Replayed"))
			require.Empty(t, res.Header().Values("Preference-Applied"), "no preference was sent")
			require.Equal(t, "k-1", res.Header().Get("Idempotency-Key"))
			require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 1, "responded": 1}, b.counts.Get())
		})
	}
}

// When the wait runs out, the Stripe profile answers 429 lock_timeout,
// which the Stripe SDKs retry, and the IETF profile its 409. A client that
// asks not to wait (Prefer: wait=0, where MaxWait is set) gets the 409 at
// once, in both.
func TestDefaultWaitRunsOut(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		profile      idemhttp.Profile
		status       int
		code, prefer string
	}{
		{idemhttp.ProfileIETF, http.StatusConflict, "", ""},
		{idemhttp.ProfileStripe, http.StatusTooManyRequests, idemhttp.StripeCodeLockTimeout, ""},
		{idemhttp.ProfileIETF, http.StatusConflict, "", "wait=0"},
		{idemhttp.ProfileStripe, http.StatusConflict, idemhttp.StripeCodeKeyInUse, "wait=0"},
	} {
		t.Run(tc.profile.String()+"/"+tc.prefer, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tc.profile)
			b.runner = b.newRunner(t, &idem.Config{Test: idem.TestConfig{Now: time.Now}})
			h := b.handler(t, func(c *idemhttp.Config[rideInput]) {
				c.DefaultWait = time.Second
				c.MaxWait = time.Minute
			})
			release, first := heldKey(t, b, h, "k-1")
			r := request("k-1", rideBody)
			if tc.prefer != "" {
				r.Header.Set("Prefer", tc.prefer)
			}
			res := serve(h, r)
			release()
			require.Equal(t, http.StatusCreated, (<-first).Code)

			require.Equal(t, tc.status, res.Code, res.Body.String())
			p := decodeProblem(t, res)
			require.Equal(t, idemhttp.ProblemTypeBaseDefault+idemhttp.ProblemInProgress, p.Type)
			require.Equal(t, tc.status, p.Status)
			require.NotEmpty(t, res.Header().Get("Retry-After"))
			require.Equal(t, "k-1", res.Header().Get("Idempotency-Key"))
			if tc.profile == idemhttp.ProfileStripe {
				require.Equal(t, tc.code, p.Error.Code)
			}
		})
	}
}

// Without MaxWait, Prefer: wait is still read, within DefaultWait: wait=0
// answers at once (in the Stripe profile the 409 idempotency_key_in_use,
// not the 429 of a wait that ran out), and wait=N waits, at most
// DefaultWait, and says so with Preference-Applied.
func TestPreferWaitWithoutMaxWait(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileStripe)
	b.runner = b.newRunner(t, &idem.Config{Test: idem.TestConfig{Now: time.Now}})
	h := b.handler(t, func(c *idemhttp.Config[rideInput]) { c.DefaultWait = time.Minute })
	release, first := heldKey(t, b, h, "k-1")

	r := request("k-1", rideBody)
	r.Header.Set("Prefer", "wait=0")
	res := serve(h, r)
	require.Equal(t, http.StatusConflict, res.Code, res.Body.String())
	require.Equal(t, idemhttp.StripeCodeKeyInUse, decodeProblem(t, res).Error.Code)

	retry := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		r := request("k-1", rideBody)
		r.Header.Set("Prefer", "wait=3600")
		retry <- serve(h, r)
	}()
	b.waitingOn(t)
	release()
	require.Equal(t, http.StatusCreated, (<-first).Code)
	res = <-retry
	require.Equal(t, http.StatusCreated, res.Code, res.Body.String())
	require.Equal(t, "true", res.Header().Get("Idempotent-Replayed"))
	require.Equal(t, "wait=60", res.Header().Get("Preference-Applied"), "granted at most DefaultWait")
}
