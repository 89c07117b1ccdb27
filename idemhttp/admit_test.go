package idemhttp_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
)

// A scope that Config.Admit refuses a new key is answered 429 with the
// Retry-After the hook gave, and nothing is written; a retry of a key it
// already has is served as usual.
func TestTooManyKeysIs429(t *testing.T) {
	t.Parallel()
	for _, profile := range []idemhttp.Profile{idemhttp.ProfileIETF, idemhttp.ProfileStripe} {
		b := setup(t, profile)
		res := post(b.handler(t, nil), "k-1", rideBody)
		require.Equal(t, http.StatusCreated, res.Code)

		full := b.newRunner(t, &idem.Config{Admit: func(context.Context, string, string) error {
			return idem.TooManyKeys(90 * time.Second)
		}})
		h := b.handlerOn(t, full, b.flow, nil)
		res = post(h, "k-2", rideBody)
		require.Equal(t, http.StatusTooManyRequests, res.Code, res.Body.String())
		require.Equal(t, "90", res.Header().Get("Retry-After"))
		p := decodeProblem(t, res)
		require.Equal(t, idemhttp.ProblemTypeBaseDefault+idemhttp.ProblemTooManyKeys, p.Type)
		require.Equal(t, http.StatusTooManyRequests, p.Status)
		if profile == idemhttp.ProfileStripe {
			require.Equal(t, idemhttp.StripeInvalidRequestError, p.Error.Type)
			require.Equal(t, "rate_limit", p.Error.Code)
		}
		require.Nil(t, b.keyRow(t, "k-2"), "nothing written")

		res = post(h, "k-1", rideBody)
		require.Equal(t, http.StatusCreated, res.Code, "a retry of an existing key is not refused")
		require.Equal(t, "true", res.Header().Get("Idempotent-Replayed"))
	}
}
