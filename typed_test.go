package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
)

type charge struct {
	ID     string  `json:"id"`
	Amount float64 `json:"amount"`
}

// The typed helpers in one flow: RespondJSONWith adds a header, and
// idem.Execute takes the input typed.
func TestTypedHelpers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	calls := 0
	flow := idem.MustNewFlow("typed.rides", []idem.Phase[rideInput]{
		{
			Name: "charged",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) (idem.Result, error) {
				var c charge
				ok, err := run.Checkpoint("charge", &c)
				require.NoError(t, err)
				require.False(t, ok, "nothing recorded yet")
				err = run.Foreign(ctx, "charge", func(ctx context.Context, key string) error {
					calls++
					require.Equal(t, run.IdempotencyKey(), key)
					c = charge{ID: "ch_" + key[len(key)-4:], Amount: run.Input().Amount}
					return nil
				})
				if err != nil {
					return idem.Result{}, err
				}
				return idem.Advance(), run.SetCheckpoint("charge", c)
			},
		},
		{
			Name: "responded",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) (idem.Result, error) {
				var c charge
				ok, err := run.Checkpoint("charge", &c)
				if err != nil || !ok {
					return idem.Result{}, fmt.Errorf("no charge checkpoint (found %v): %w", ok, err)
				}
				return idem.RespondJSONWith(http.StatusCreated, http.Header{"Location": {"/charges/" + c.ID}}, c), nil
			},
		},
	}, nil)
	r := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{flow}})

	out, err := idem.Execute(ctx, r, flow, idem.Request{Scope: "user:1", Key: "typed-1"}, rideInput{Origin: "SF", Amount: 12.5})
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, 1, calls)
	require.Equal(t, "application/json", out.Response.Header.Get("Content-Type"))
	require.Regexp(t, `^/charges/ch_....$`, out.Response.Header.Get("Location"))
	require.JSONEq(t, fmt.Sprintf(`{"id": %q, "amount": 12.5}`, out.Response.Header.Get("Location")[len("/charges/"):]), string(out.Response.Body))

	// The same request through Runner.Execute with untyped params is the
	// same request: a replay.
	out, err = r.Execute(ctx, flow, idem.Request{Scope: "user:1", Key: "typed-1", Params: rideInput{Origin: "SF", Amount: 12.5}})
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)

	// Params and the typed input together are refused before anything is
	// written.
	out, err = idem.Execute(ctx, r, flow, idem.Request{Scope: "user:1", Key: "typed-2", Params: rideInput{}}, rideInput{Origin: "SF"})
	require.ErrorIs(t, err, idem.ErrInvalidParams)
	require.Equal(t, idem.OutcomeInvalid, out.Kind)
	_, err = b.store.GetKey(ctx, "user:1", "typed-2")
	require.ErrorIs(t, err, idem.ErrNotFound)
}

// RespondJSONWith keeps a Content-Type the phase sets, and copies the
// header it is given.
func TestRespondJSONWithHeaders(t *testing.T) {
	t.Parallel()
	h := http.Header{"Content-Type": {"application/vnd.api+json"}, "Location": {"/x"}}
	res := idem.RespondJSONWith(http.StatusOK, h, map[string]int{"a": 1})
	require.True(t, res.Responds())
	h.Set("Location", "/changed")

	b := setup(t)
	flow := idem.MustNewFlow("typed.header", []idem.Phase[rideInput]{{
		Name: "responded",
		Do: func(context.Context, idem.Tx, *idem.Attempt[rideInput]) (idem.Result, error) {
			return res, nil
		},
	}}, nil)
	out, err := idem.Execute(context.Background(), b.runner(t, &idem.Config{Flows: []idem.AnyFlow{flow}}), flow,
		idem.Request{Scope: "user:1", Key: "hdr"}, rideInput{})
	require.NoError(t, err)
	require.Equal(t, "application/vnd.api+json", out.Response.Header.Get("Content-Type"))
	require.Equal(t, "/x", out.Response.Header.Get("Location"))
	require.JSONEq(t, `{"a":1}`, string(out.Response.Body))

	require.False(t, idem.RespondJSONWith(99, nil, 1).Responds())
	require.False(t, idem.RespondJSONWith(http.StatusOK, nil, func() {}).Responds())
}
