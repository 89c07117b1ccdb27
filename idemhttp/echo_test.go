package idemhttp_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemhttp"
)

// A problem names what is wrong with a request, but never echoes a long
// value back whole: a 500 KB number in an integer field used to come back
// in full in the 422's detail and its errors.
func TestProblemsDoNotEchoLongValues(t *testing.T) {
	t.Parallel()
	for _, profile := range []idemhttp.Profile{idemhttp.ProfileIETF, idemhttp.ProfileStripe} {
		b := setup(t, profile)
		h := b.handler(t, nil)
		huge := strings.Repeat("9", 500_000)
		for name, res := range map[string]*http.Response{
			"number":        post(h, "k-1", `{"origin": "SFO", "amount": `+huge+`}`).Result(),
			"fraction":      post(h, "k-1", `{"origin": "SFO", "amount": 1.`+huge+`}`).Result(),
			"unknown field": post(h, "k-1", `{"origin": "SFO", "amount": 1, "`+huge+`": 1}`).Result(),
			"content type": func() *http.Response {
				r := request("k-1", rideBody)
				r.Header.Set("Content-Type", "application/x"+huge)
				return serve(h, r).Result()
			}(),
			"charset": func() *http.Response {
				r := request("k-1", rideBody)
				r.Header.Set("Content-Type", "application/json; charset=x"+huge)
				return serve(h, r).Result()
			}(),
			"encoding": func() *http.Response {
				r := request("k-1", rideBody)
				r.Header.Set("Content-Encoding", "x"+huge)
				return serve(h, r).Result()
			}(),
		} {
			require.GreaterOrEqual(t, res.StatusCode, 400, name)
			require.Less(t, res.ContentLength, int64(1200), "%s (%s): the problem stays small", name, profile)
		}
		b.requireNothingWritten(t)
	}
	// Short values are still echoed whole.
	b := setup(t, idemhttp.ProfileIETF)
	p := decodeProblem(t, post(b.handler(t, nil), "k-1", `{"origin": "SFO", "amount": 1.5}`))
	require.Equal(t, "must be an integer from -9223372036854775808 to 9223372036854775807, not 1.5", p.Errors[0].Detail)
}
