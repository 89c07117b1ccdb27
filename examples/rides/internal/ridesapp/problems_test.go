package ridesapp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

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
