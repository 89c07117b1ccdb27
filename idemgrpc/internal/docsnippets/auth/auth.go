// Package auth stands for a service's authentication in the snippets of
// docs/grpc.md: it finds the caller of a call.
package auth

import "context"

// User is an authenticated caller.
type User struct{ ID string }

type userKey struct{}

// FromContext returns the caller an interceptor put in ctx.
func FromContext(ctx context.Context) (*User, bool) {
	u, ok := ctx.Value(userKey{}).(*User)
	return u, ok
}
