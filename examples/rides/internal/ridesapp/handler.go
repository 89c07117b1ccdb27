package ridesapp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
)

// The details of the two 401s, as in rocket-rides-atomic.
const (
	DetailAuthRequired = "Please specify credentials in the Authorization header: Bearer <email>."
	DetailAuthInvalid  = "Credentials in Authorization were invalid."
)

const authChallenge = `Bearer realm="rides"`

// user is an authenticated caller.
type user struct {
	ID    int64
	Email string
}

// authKey carries, through one request, the user its scope was derived
// from, so that Prepare need not look the user up a second time.
type authKey struct{}

// newHandler builds the HTTP API:
//
//	POST /rides    create a ride (Authorization: Bearer <email>, Idempotency-Key)
//	GET  /healthz  200 when the database answers
//
// Other methods on those paths answer 405 as a problem, with Allow.
func (a *App) newHandler() (http.Handler, error) {
	rides, err := idemhttp.New(a.runner, a.flow, &idemhttp.Config[RideParams]{
		Scope:         a.scope,
		Prepare:       a.prepare,
		Validate:      validate,
		MinKeyLength:  a.minKeyLength,
		AuthChallenge: authChallenge,
		Logger:        a.logger,
	})
	if err != nil {
		return nil, fmt.Errorf("rides: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /rides", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The origin IP goes to the audit record through the context: it
		// belongs to this attempt, not to the request's fingerprinted input.
		ctx := WithOriginIP(r.Context(), remoteIP(r))
		ctx = context.WithValue(ctx, authKey{}, new(user))
		rides.ServeHTTP(w, r.WithContext(ctx))
	}))
	mux.HandleFunc("GET /healthz", a.healthz)
	// Without these, ServeMux answers other methods with a plain-text 405.
	mux.Handle("/rides", rides.MethodNotAllowed(http.MethodPost))
	mux.Handle("/healthz", rides.MethodNotAllowed(http.MethodGet, http.MethodHead))
	return mux, nil
}

// Handler returns the HTTP API.
func (a *App) Handler() http.Handler { return a.handler }

// scope authenticates the caller, trusting (as rocket-rides-atomic does, and
// as no real service should) that a caller is whoever the email in the
// Authorization header says. The scope is the user's id, so each user's keys
// are their own.
func (a *App) scope(r *http.Request) (string, error) {
	email, ok := bearerEmail(r.Header.Get("Authorization"))
	if !ok {
		return "", unauthenticated(DetailAuthRequired)
	}
	u, err := a.lookupUser(r.Context(), email)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", unauthenticated(DetailAuthInvalid)
	}
	if err != nil {
		// The users live in the database that holds the keys: idemhttp
		// answers its own 503 store-unavailable, with its Retry-After.
		return "", fmt.Errorf("rides: look up user: %w: %w", idem.ErrStoreUnavailable, err)
	}
	if holder, ok := r.Context().Value(authKey{}).(*user); ok {
		*holder = *u
	}
	return scopeOf(u.ID), nil
}

func scopeOf(userID int64) string { return "user:" + strconv.FormatInt(userID, 10) }

// prepare sets the server-derived user id, overwriting anything the body
// said.
func (a *App) prepare(r *http.Request, in *RideParams) error {
	if holder, ok := r.Context().Value(authKey{}).(*user); ok && holder.ID != 0 {
		in.UserID = holder.ID
		return nil
	}
	email, _ := bearerEmail(r.Header.Get("Authorization"))
	u, err := a.lookupUser(r.Context(), email)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("rides: user %q is gone: %w", email, err)
	case err != nil:
		return fmt.Errorf("rides: look up user: %w: %w", idem.ErrStoreUnavailable, err)
	}
	in.UserID = u.ID
	return nil
}

func validate(in *RideParams) []idemhttp.FieldError {
	var out []idemhttp.FieldError
	for _, p := range in.Validate() {
		out = append(out, idemhttp.FieldError{Field: p.Field, Detail: p.Detail})
	}
	return out
}

func unauthenticated(detail string) *idemhttp.Problem {
	return &idemhttp.Problem{
		Type:   idemhttp.ProblemTypeBaseDefault + idemhttp.ProblemUnauthenticated,
		Title:  "Authentication required",
		Status: http.StatusUnauthorized,
		Detail: detail,
		Header: http.Header{"Www-Authenticate": {authChallenge}},
	}
}

// bearerEmail returns the credentials of an "Authorization: Bearer <email>"
// header.
func bearerEmail(header string) (string, bool) {
	scheme, credentials, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	credentials = strings.TrimSpace(credentials)
	return credentials, credentials != ""
}

// lookupUser reads a user under the runner's statement bound, so a database
// that stops answering gets the request a 503 in that time, as the runner's
// own statements do, never a hang.
func (a *App) lookupUser(ctx context.Context, email string) (*user, error) {
	ctx, cancel := context.WithTimeout(ctx, a.runner.Config().StatementTimeout)
	defer cancel()
	var u user
	err := a.pool.QueryRow(ctx, `SELECT id, email FROM `+a.prefix+`users WHERE email = $1`, email).Scan(&u.ID, &u.Email)
	if err != nil {
		return nil, err
	}
	return &u, nil
}

func (a *App) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := a.pool.Ping(ctx); err != nil {
		http.Error(w, "database unavailable", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}
