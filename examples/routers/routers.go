// Package routers mounts an idemhttp handler on gin and on echo, and shows
// the one line each needs so that the handler's Config.Scope and
// Config.Prepare, which see only the *http.Request, find what the router's
// own middleware learned about the caller.
//
// gin.WrapH and echo.WrapHandler hand the handler the request as it is.
// An authentication middleware written for gin or echo keeps the caller in
// the framework's context (c.Set("user", ...)), which the *http.Request
// does not carry; the bridge copies it into the request's context. The
// same holds for any value Prepare needs. docs/http.md has the snippets.
package routers

import (
	"context"
	"net/http"

	"github.com/go-idem/idem/idemhttp"
)

// User is the authenticated caller, as the router's auth middleware finds it.
type User struct {
	ID     string
	Tenant string
}

type userKey struct{}

// WithUser returns ctx carrying u.
func WithUser(ctx context.Context, u User) context.Context {
	return context.WithValue(ctx, userKey{}, u)
}

// UserFrom returns the user a bridge put in ctx.
func UserFrom(ctx context.Context) (User, bool) {
	u, ok := ctx.Value(userKey{}).(User)
	return u, ok
}

// Scope is a Config.Scope that reads the caller from the request's context,
// where the bridge put it.
func Scope(r *http.Request) (string, error) {
	u, ok := UserFrom(r.Context())
	if !ok {
		return "", idemhttp.ErrUnauthenticated
	}
	return "tenant:" + u.Tenant, nil
}
