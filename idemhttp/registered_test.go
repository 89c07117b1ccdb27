package idemhttp_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
)

// New and NewWebhook refuse a flow the runner does not know: its requests
// would run, but the completer, which claims only the runner's flows,
// would never finish one whose client gave up.
func TestNewRefusesAFlowTheRunnerDoesNotKnow(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	stranger := b.rideFlow(nil) // named rides.create, like the runner's, but another flow
	lost := idem.MustNewFlow("rides.lost", []idem.Phase[rideInput]{{
		Name: "responded",
		Do: func(_ context.Context, _ idem.Tx, _ *idem.Attempt[rideInput]) (idem.Result, error) {
			return idem.RespondJSON(http.StatusOK, nil), nil
		},
	}}, nil)
	webhook := &idemhttp.WebhookConfig{Provider: "stripe", EventID: idemhttp.JSONValue("id"),
		Verify: func(*http.Request, []byte) error { return nil }}
	for _, tc := range []struct {
		flow *idem.Flow[rideInput]
		want string
	}{
		{lost, `flow "rides.lost" is not in the runner's idem.Config.Flows`},
		{stranger, `the runner's idem.Config.Flows holds another flow named "rides.create"`},
	} {
		_, err := idemhttp.New(b.runner, tc.flow, b.config())
		require.ErrorContains(t, err, tc.want)
		_, err = idemhttp.NewWebhook(b.runner, tc.flow, webhook)
		require.ErrorContains(t, err, tc.want)
	}
	_, err := idemhttp.New(b.runner, b.flow, b.config())
	require.NoError(t, err)
}

// runnerWith is a runner on the bundle's store and clock that knows the
// bundle's flows and more.
func (b *bundle) runnerWith(t testing.TB, more ...idem.AnyFlow) *idem.Runner {
	t.Helper()
	r, err := idem.NewRunner(b.store, &idem.Config{Test: idem.TestConfig{Now: b.clock.Now},
		Flows: append([]idem.AnyFlow{b.flow, b.quote, b.sms}, more...)})
	require.NoError(t, err)
	return r
}
