package docsnippets

import (
	"context"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/examples/internal/docsnippets/auth"
	"github.com/go-idem/idem/idemhttp"
)

// RideParams is the input of docs/http.md's rides endpoint.
type RideParams struct {
	OriginLat float64 `json:"origin_lat"`
	OriginLon float64 `json:"origin_lon"`
	UserEmail string  `json:"-"`
}

// OrderParams is the input of docs/http.md's orders endpoint.
type OrderParams struct {
	SKU string `json:"sku"`
}

// httpWiring holds docs/http.md, "Wiring a flow".
func httpWiring(runner *idem.Runner, createRide *idem.Flow[RideParams], orders *idemhttp.Handler[OrderParams], list http.Handler, listOrders http.HandlerFunc) (*http.ServeMux, http.Handler, error) {
	rides, err := idemhttp.New(runner, createRide, &idemhttp.Config[RideParams]{
		// Required: who owns the key. There is no global scope.
		Scope: func(r *http.Request) (string, error) {
			user, err := auth.User(r)
			if err != nil {
				return "", idemhttp.ErrUnauthenticated // 401
			}
			return "user:" + user.ID, nil
		},
		// Optional: server-derived fields, set after decoding and before
		// validation (the fingerprint is over the body as sent).
		Prepare: func(r *http.Request, in *RideParams) error {
			in.UserEmail = auth.MustUser(r).Email
			return nil
		},
		// Optional: field errors answer 422.
		Validate: func(in *RideParams) []idemhttp.FieldError {
			if in.OriginLat < -90 || in.OriginLat > 90 {
				return []idemhttp.FieldError{{Field: "origin_lat", Detail: "must be between -90 and 90"}}
			}
			return nil
		},
		ReplayHeaders: []string{"Location"},
	})
	if err != nil {
		return nil, nil, err
	}

	mux := http.NewServeMux()
	mux.Handle("POST /rides", rides)
	mux.Handle("PATCH /rides", rides)                                               // only if PATCH should run the flow too
	mux.Handle("/rides", rides.MethodNotAllowed(http.MethodPost, http.MethodPatch)) // GET, PUT...: 405 problem, Allow: POST, PATCH
	mux.Handle("/orders", orders.Middleware(list))                                  // POST and PATCH run the flow; GET, HEAD, ... go to list untouched

	r := chi.NewRouter()
	r.Method(http.MethodPost, "/rides", rides)
	// Every method of /orders: POST and PATCH run the flow, the rest reach listOrders.
	r.Handle("/orders", orders.Middleware(http.HandlerFunc(listOrders)))

	return mux, r, nil
}

// httpLongRequests holds docs/http.md, "Long requests".
func httpLongRequests(runner *idem.Runner, createRide *idem.Flow[RideParams], scopeFromAuth func(*http.Request) (string, error),
	auth func(http.Handler) http.Handler, mux *http.ServeMux) error {
	rides, err := idemhttp.New(runner, createRide, &idemhttp.Config[RideParams]{
		Scope:        scopeFromAuth,
		RespondAsync: true,
		MonitorURL:   "/rides/requests",
	})
	if err != nil {
		return err
	}
	mux.Handle("POST /rides", rides)
	mux.Handle("GET /rides/requests", auth(rides.Monitor())) // behind the same authentication
	return nil
}

// httpLongRequestsShutdown holds docs/http.md, "Long requests": the
// shutdown of a process that answers 202.
func httpLongRequestsShutdown(ctx context.Context, srv *http.Server) {
	_ = srv.Shutdown(ctx)                      // no new requests; the handlers have returned
	_ = idemhttp.DefaultDetachedRuns.Wait(ctx) // the requests answered 202 have ended
}
