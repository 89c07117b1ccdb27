package ridesapp

import (
	"context"
	"net"
	"net/http"
)

type originIPKey struct{}

// WithOriginIP returns ctx carrying the client's IP address, for the audit
// record of the ride the request creates.
//
// The address travels in the context, not in RideParams, on purpose: the
// input is fingerprinted and stored, and a retry from another address (a
// phone that changed networks) is still the same request.
func WithOriginIP(ctx context.Context, ip string) context.Context {
	return context.WithValue(ctx, originIPKey{}, ip)
}

// OriginIP returns the IP address WithOriginIP stored, or "" when the request
// has no client, as when it is completed server-side.
func OriginIP(ctx context.Context) string {
	ip, _ := ctx.Value(originIPKey{}).(string)
	return ip
}

// remoteIP is the IP part of r.RemoteAddr, or "" when it is not an address
// (an in-memory transport). X-Forwarded-For is deliberately ignored: this
// service is not behind a proxy it could trust.
func remoteIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if net.ParseIP(host) == nil {
		return ""
	}
	return host
}
