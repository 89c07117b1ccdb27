package ridesapp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/examples/rides/internal/ridesapp"
	"github.com/go-idem/idem/idemhttp"
)

// The API's own database check answers with idemhttp's 503 store-unavailable
// problem, title and Retry-After included, not a look-alike of its own.
func TestDatabaseUnavailableIsIdemhttps503(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	pool, err := pgxpool.New(context.Background(), b.schema.URL)
	require.NoError(t, err)
	pool.Close() // every query on it fails, as on a database that went away
	app, err := ridesapp.New(&ridesapp.Config{Pool: pool, Schema: b.schema.Name, Payments: b.payments, Logger: testLogger})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, app.Stop(context.Background())) })
	api := httptest.NewServer(app.Handler())
	t.Cleanup(api.Close)

	req, err := http.NewRequest(http.MethodPost, api.URL+"/rides", strings.NewReader(validBody))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+ridesapp.GoodUserEmail)
	req.Header.Set("Idempotency-Key", newKey())
	resp, err := api.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	r := &response{status: resp.StatusCode, header: resp.Header, body: body}

	require.Equal(t, http.StatusServiceUnavailable, r.status, "body: %s", r.body)
	require.Equal(t, "5", r.header.Get("Retry-After"), "idemhttp's UnavailableRetryAfter")
	p := r.problem(t)
	require.Equal(t, problemBase+idemhttp.ProblemStoreUnavailable, p["type"])
	require.Equal(t, "Idempotency key store unavailable", p["title"])
	require.EqualValues(t, http.StatusServiceUnavailable, p["status"])
}

// A database that stops answering, instead of refusing connections: the
// whole rides API fails closed within the runner's statement bound (the user
// lookup included), and the same request succeeds once it answers again.
func TestStalledDatabaseIs503WithinTheBound(t *testing.T) {
	t.Parallel()
	// Generous: the same bound covers the warm-up and the retry after the
	// stall, and a loaded machine under the race detector is slow.
	const timeout = 2 * time.Second
	b := setup(t, &options{proxied: true, statementTimeout: timeout})
	key := newKey()
	require.Equal(t, http.StatusCreated, b.ride(t, newKey()).status, "warm-up through the proxy")

	b.proxy.Stall()
	started := time.Now()
	r := b.ride(t, key)
	took := time.Since(started)
	require.Equal(t, http.StatusServiceUnavailable, r.status, "body: %s", r.body)
	require.Equal(t, problemBase+idemhttp.ProblemStoreUnavailable, r.problem(t)["type"])
	// A correctness bound, not a performance target: a few bounded round
	// trips, never the TCP timeout.
	require.Less(t, took, 20*timeout)

	b.proxy.Resume()
	b.clock.Advance(idem.LeaseDefault + time.Second) // in case the insert landed before the stall
	r = b.ride(t, key)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	require.Len(t, b.provider.Charges(), 2)
}
