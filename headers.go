package idem

import (
	"net/http"

	"github.com/go-idem/idem/idemtype"
)

// neverReplayed are the response headers that are never stored with a
// key's response nor sent from it: credentials and cookies belong to one
// exchange, hop-by-hop headers to one connection, the framing headers and
// Date are computed for each response, and Idempotent-Replayed is the HTTP
// adapter's mark of a replay. Names are canonical.
var neverReplayed = map[string]bool{
	// Credentials and cookies.
	"Authorization": true, "Proxy-Authorization": true,
	"Www-Authenticate": true, "Proxy-Authenticate": true,
	"Authentication-Info": true, "Proxy-Authentication-Info": true,
	"Cookie": true, "Set-Cookie": true, "Set-Cookie2": true,
	// Hop-by-hop (RFC 9110 section 7.6.1).
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	// Per response.
	"Content-Length": true, "Date": true, "Idempotent-Replayed": true,
	// The request's own key, which the HTTP adapter sends back on every
	// answer to it: a replay answers another request, with its own key.
	"Idempotency-Key": true,
}

// ReplayableHeader reports whether a response header may be stored with a
// key's response and sent again on replays. It is false for the headers
// that belong to one exchange or one connection, whatever the flow or the
// HTTP adapter is configured to replay: Authorization, Proxy-Authorization,
// WWW-Authenticate, Proxy-Authenticate, Authentication-Info,
// Proxy-Authentication-Info, Cookie, Set-Cookie, Set-Cookie2, the
// hop-by-hop headers (Connection, Keep-Alive, Proxy-Connection, TE,
// Trailer, Transfer-Encoding, Upgrade), Content-Length, Date,
// Idempotent-Replayed and Idempotency-Key. name is matched case-insensitively.
func ReplayableHeader(name string) bool {
	return !neverReplayed[http.CanonicalHeaderKey(name)]
}

// storableResponse drops headers that must never be replayed: credentials,
// cookies and hop-by-hop headers belong to one exchange, not to the stored
// outcome of a request. It is applied before the first answer too, so the
// first caller gets exactly what every replay gets.
func storableResponse(resp *idemtype.Response) *idemtype.Response {
	out := &idemtype.Response{Status: resp.Status, Body: resp.Body, Header: http.Header{}}
	for name, values := range resp.Header {
		if !ReplayableHeader(name) {
			continue
		}
		out.Header[http.CanonicalHeaderKey(name)] = append([]string(nil), values...)
	}
	return out
}
