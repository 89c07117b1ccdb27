package orders

import (
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
)

// TenantHeader carries the caller's tenant. It stands in for real
// authentication, which is where a service takes the tenant from.
const TenantHeader = "X-Tenant"

// Scope is the handler's Config.Scope: the key belongs to the caller's
// tenant. The flow reads the tenant back from the key's scope.
func Scope(r *http.Request) (string, error) {
	tenant := r.Header.Get(TenantHeader)
	if tenant == "" {
		return "", idemhttp.ErrUnauthenticated
	}
	return ScopePrefix + tenant, nil
}

// NewHandler mounts the flow with the Idempotency-Key contract.
func NewHandler(runner *idem.Runner, flow *idem.Flow[Params]) (*idemhttp.Handler[Params], error) {
	return idemhttp.New(runner, flow, &idemhttp.Config[Params]{
		Scope:         Scope,
		ReplayHeaders: []string{"Location"},
		Validate: func(in *Params) []idemhttp.FieldError {
			if in.Quantity < 1 {
				return []idemhttp.FieldError{{Field: "quantity", Detail: "must be at least 1"}}
			}
			return nil
		},
	})
}

// Routes is the service's chi router. middleware.Timeout bounds the
// request's context, but idemhttp runs the flow detached from the request's
// cancellation and deadline (a half-done request is worth finishing), so it
// never reaches a phase: what bounds a phase is the runner's
// Config.PhaseStatementTimeout (each statement) and Config.StatementTimeout
// (the runner's own round trips), and the timeouts of your provider client.
func Routes(orders http.Handler) http.Handler {
	r := chi.NewRouter()
	r.Use(middleware.Timeout(10 * time.Second))
	r.Method(http.MethodPost, "/orders", orders)
	return r
}
