package idem_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
)

func TestReplayableHeader(t *testing.T) {
	t.Parallel()
	for _, name := range []string{
		"Authorization", "proxy-authorization", "WWW-Authenticate", "Proxy-Authenticate",
		"Authentication-Info", "Proxy-Authentication-Info",
		"Cookie", "set-cookie", "Set-Cookie2",
		"Connection", "Keep-Alive", "Proxy-Connection", "TE", "Trailer", "Transfer-Encoding", "Upgrade",
		"Content-Length", "date", "Idempotent-Replayed",
	} {
		require.False(t, idem.ReplayableHeader(name), name)
	}
	for _, name := range []string{"Content-Type", "location", "Cache-Control", "X-Request-Id", "ETag", "Retry-After"} {
		require.True(t, idem.ReplayableHeader(name), name)
	}
}
