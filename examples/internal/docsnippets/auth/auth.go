// Package auth stands for an application's authentication in the snippets
// of docs/: it finds the caller of a request.
package auth

import (
	"context"
	"errors"
	"net/http"
)

// Identity is an authenticated caller.
type Identity struct {
	ID    string
	Email string
}

// User returns the caller of r.
func User(r *http.Request) (*Identity, error) {
	return FromRequest(r)
}

// MustUser returns the caller of r, which an earlier middleware checked.
func MustUser(r *http.Request) *Identity {
	u, err := FromRequest(r)
	if err != nil {
		panic(err)
	}
	return u
}

// FromRequest reads the caller from a header, as a stand-in.
func FromRequest(r *http.Request) (*Identity, error) {
	id := r.Header.Get("X-User")
	if id == "" {
		return nil, errors.New("auth: no user")
	}
	return &Identity{ID: id, Email: id + "@example.com"}, nil
}

type userKey struct{}

// FromContext returns the caller an interceptor put in ctx.
func FromContext(ctx context.Context) (*Identity, bool) {
	u, ok := ctx.Value(userKey{}).(*Identity)
	return u, ok
}
