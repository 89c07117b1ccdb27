package idemhttp_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
	"github.com/go-idem/idem/idemtype"
)

// The 500 of a failed request the completer will finish says so, in a
// stable way a client can test: the "code" request_unfinished (and the
// Stripe error's code), in both profiles; and the completer does finish it.
// A flow the completer does not re-drive (NoRedrive) has no such code.
func TestFailedRequestSaysTheServerFinishesIt(t *testing.T) {
	t.Parallel()
	for _, profile := range []idemhttp.Profile{idemhttp.ProfileIETF, idemhttp.ProfileStripe} {
		t.Run(profile.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, profile)
			b.failOnce("charge_created", func() error { return errors.New("provider timed out") })
			res := post(b.handler(t, nil), "k-1", rideBody)
			require.Equal(t, http.StatusInternalServerError, res.Code, res.Body.String())
			p := decodeProblem(t, res)
			require.Equal(t, idemhttp.ProblemTypeBaseDefault+idemhttp.ProblemRequestFailed, p.Type)
			require.Equal(t, idemhttp.CodeRequestUnfinished, p.Code)
			if profile == idemhttp.ProfileStripe {
				require.Equal(t, idemhttp.CodeRequestUnfinished, p.Error.Code)
				require.Equal(t, p.Detail, p.Error.Message)
			}

			// Nobody retries: the completer finishes it.
			b.clock.Advance(idem.CompleteIdleForDefault + 1)
			done, err := b.runner.Complete(context.Background(), nil)
			require.NoError(t, err)
			require.Equal(t, 1, done.Completed)
			require.Equal(t, idemtype.StoredFinished, b.keyRow(t, "k-1").Status)
			require.Equal(t, 1, b.provider.Charges())

			// A flow the completer leaves to its clients has no such code.
			stays := b.rideFlow(&idem.FlowConfig[rideInput]{NoRedrive: true})
			runner, err := idem.NewRunner(b.store, &idem.Config{Test: idem.TestConfig{Now: b.clock.Now}, Flows: []idem.AnyFlow{stays}})
			require.NoError(t, err)
			b.failOnce("charge_created", func() error { return errors.New("provider timed out") })
			res = post(b.handlerOn(t, runner, stays, nil), "k-2", rideBody)
			require.Equal(t, http.StatusInternalServerError, res.Code, res.Body.String())
			p = decodeProblem(t, res)
			require.Empty(t, p.Code)
			if profile == idemhttp.ProfileStripe {
				require.Empty(t, p.Error.Code)
			}
		})
	}
}
