package routers_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/examples/orders"
	"github.com/go-idem/idem/examples/routers"
	"github.com/go-idem/idem/idemhttp"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/pgstore"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.ReleaseMode)
	idemtest.Main(m)
}

type payments struct{ *idemtest.Provider }

func (p payments) Charge(ctx context.Context, key string, c orders.ChargeRequest) (string, error) {
	e, err := p.Do(ctx, key, c.Tenant)
	return e.ID, err
}

// handler is the orders endpoint with routers.Scope, which reads the caller
// from the request's context.
func handler(t *testing.T) (*idemhttp.Handler[orders.Params], *pgstore.Store) {
	t.Helper()
	ctx := context.Background()
	schema := idemtest.NewSchema(t)
	_, err := schema.Pool.Exec(ctx, orders.Schema)
	require.NoError(t, err)
	_, err = schema.Pool.Exec(ctx, `INSERT INTO products (tenant_id, sku, price_cents) VALUES ('acme', 'rocket', 1500)`)
	require.NoError(t, err)
	store, err := pgstore.New(schema.Pool, nil)
	require.NoError(t, err)
	t.Cleanup(store.Close)
	flow := orders.NewFlow(payments{&idemtest.Provider{}})
	runner, err := idem.NewRunner(store, &idem.Config{Flows: []idem.AnyFlow{flow}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	h, err := idemhttp.New(runner, flow, &idemhttp.Config[orders.Params]{Scope: routers.Scope, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	return h, store
}

func post(h http.Handler, tenant, key string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"sku": "rocket", "quantity": 1}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Tenant", tenant)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

func TestBridges(t *testing.T) {
	t.Parallel()
	for name, mount := range map[string]func(http.Handler) http.Handler{
		"gin":  func(h http.Handler) http.Handler { return routers.Gin(h) },
		"echo": func(h http.Handler) http.Handler { return routers.Echo(h) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h, store := handler(t)
			srv := mount(h)
			first := post(srv, "acme", "k1")
			require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
			again := post(srv, "acme", "k1")
			require.Equal(t, http.StatusCreated, again.Code)
			require.Equal(t, "true", again.Header().Get("Idempotent-Replayed"))
			require.Equal(t, first.Body.String(), again.Body.String())
			// The key is the tenant's, as the router's middleware found it.
			_, err := store.GetKey(context.Background(), "tenant:acme", "k1")
			require.NoError(t, err)
		})
	}
}

// Without the bridge, Scope does not find the caller gin's middleware
// found: every request is unauthenticated.
func TestWithoutTheBridgeScopeSeesNoUser(t *testing.T) {
	t.Parallel()
	h, _ := handler(t)
	r := gin.New()
	r.POST("/orders", routers.GinAuth, gin.WrapH(h))
	require.Equal(t, http.StatusUnauthorized, post(r, "acme", "k1").Code)
}
