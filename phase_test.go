package idem_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
)

// A response must have a final HTTP status, 200 to 599: anything else is
// the phase's error, so the key stays unfinished, stores nothing, and a
// retry runs the phase again.
func TestRespondRefusesAStatusOutside200To599(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		result idem.Result
	}{
		{"Respond 100", idem.Respond(http.StatusContinue, nil, nil)},
		{"Respond 199", idem.Respond(199, nil, []byte("x"))},
		{"Respond 600", idem.Respond(600, nil, nil)},
		{"Respond 0", idem.Respond(0, nil, nil)},
		{"RespondJSON 101", idem.RespondJSON(http.StatusSwitchingProtocols, map[string]int{"a": 1})},
		{"RespondJSON -1", idem.RespondJSON(-1, nil)},
	} {
		require.False(t, tc.result.Responds(), tc.name)
		flow := idem.MustNewFlow("odd.status", []idem.Phase[rideInput]{{
			Name: "responded",
			Do: func(context.Context, idem.Tx, *idem.Attempt[rideInput]) (idem.Result, error) {
				return tc.result, nil
			},
		}}, nil)
		r := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{flow}})
		key := "k-" + tc.name
		out, err := r.Execute(ctx, flow, b.request(key, rideInput{Origin: "SF"}))
		require.ErrorIs(t, err, idem.ErrPhaseFailed, tc.name)
		require.ErrorContains(t, err, "not between 200 and 599", tc.name)
		require.Equal(t, idem.OutcomeFailed, out.Kind, tc.name)

		rec := b.key(t, key)
		require.Equal(t, idemtype.StoredRunning, rec.Status, tc.name)
		require.Zero(t, rec.ResponseStatus, tc.name)
		require.Nil(t, rec.LockedAt, tc.name)
	}

	for _, status := range []int{http.StatusOK, http.StatusPaymentRequired, 599} {
		require.True(t, idem.Respond(status, nil, nil).Responds(), status)
		require.True(t, idem.RespondJSON(status, nil).Responds(), status)
	}
}
