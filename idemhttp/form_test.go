package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
)

// formRequest is request with a form body.
func formRequest(key, body string) *http.Request {
	r := request(key, body)
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return r
}

// The Stripe profile reads a form, as the Stripe SDKs send it, beside JSON.
// The key's fingerprint is taken over the decoded form, so a retry with
// its fields in another order (or the same request as JSON) is the same
// request, and one with another value is not.
func TestStripeProfileReadsForms(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileStripe)
	h := b.handler(t, nil)
	first := serve(h, formRequest("k-1", "amount=20&origin=SFO"))
	require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
	for name, res := range map[string]*httptest.ResponseRecorder{
		"fields in another order": serve(h, formRequest("k-1", "origin=SFO&amount=20")),
		"escaped":                 serve(h, formRequest("k-1", "origin=%53FO&amount=20&")),
		"as JSON":                 post(h, "k-1", `{"amount": 20, "origin": "SFO"}`),
	} {
		require.Equal(t, http.StatusCreated, res.Code, "%s: %s", name, res.Body)
		require.Equal(t, "true", res.Header().Get("Idempotent-Replayed"), name)
		require.Equal(t, first.Body.String(), res.Body.String(), name)
	}
	reused := serve(h, formRequest("k-1", "origin=SFO&amount=21"))
	require.Equal(t, http.StatusBadRequest, reused.Code)
	require.Equal(t, idemhttp.StripeIdempotencyError, decodeProblem(t, reused).Error.Type)
	b.requireFinished(t, "k-1", first)

	// A value that does not fit the input is named, as in JSON.
	res := serve(h, formRequest("k-2", "origin=SFO&amount=twenty"))
	require.Equal(t, http.StatusBadRequest, res.Code)
	p := decodeProblem(t, res)
	require.Equal(t, idemhttp.ProblemTypeBaseDefault+idemhttp.ProblemInvalidInput, p.Type)
	require.Equal(t, "amount", p.Error.Param)
}

// Stripe's bracket notation: nested objects, indexed arrays of objects,
// appended arrays of values, maps.
func TestStripeProfileReadsBracketNotation(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileStripe)
	type item struct {
		Price    string `json:"price"`
		Quantity int    `json:"quantity"`
	}
	type charge struct {
		Amount   int64                   `json:"amount"`
		Capture  bool                    `json:"capture"`
		Card     struct{ Number string } `json:"card"`
		Items    []item                  `json:"items"`
		Expand   []string                `json:"expand"`
		Metadata map[string]string       `json:"metadata"`
	}
	var got charge
	flow := idem.MustNewFlow("charges.create", []idem.Phase[charge]{{
		Name: "charged",
		Do: func(_ context.Context, _ idem.Tx, run *idem.Attempt[charge]) (idem.Result, error) {
			got = run.Input()
			return idem.RespondJSON(http.StatusOK, map[string]string{"id": "ch_1"}), nil
		},
	}}, nil)
	h, err := idemhttp.New(b.runnerWith(t, flow), flow, &idemhttp.Config[charge]{Scope: bearerScope, Profile: idemhttp.ProfileStripe})
	require.NoError(t, err)
	body := "amount=2000&capture=true&card[Number]=4242&items[1][price]=p_2&items[0][price]=p_1&items[0][quantity]=3" +
		"&expand[]=customer&expand[]=invoice&metadata[order_id]=6735&metadata[note]=a+b%26c"
	res := serve(h, formRequest("k-1", body))
	require.Equal(t, http.StatusOK, res.Code, res.Body.String())
	want := charge{Amount: 2000, Capture: true, Items: []item{{"p_1", 3}, {"p_2", 0}},
		Expand: []string{"customer", "invoice"}, Metadata: map[string]string{"order_id": "6735", "note": "a b&c"}}
	want.Card.Number = "4242"
	require.Equal(t, want, got)
	row := b.keyRow(t, "k-1")
	require.JSONEq(t, `{"amount": 2000, "capture": true, "card": {"Number": "4242"}, "expand": ["customer", "invoice"],
		"items": [{"price": "p_1", "quantity": 3}, {"price": "p_2", "quantity": 0}], "metadata": {"note": "a b&c", "order_id": "6735"}}`, string(row.Params))
}

// A form that does not make one tree is refused before any key is
// written; the IETF profile reads JSON alone.
func TestMalformedForms(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileStripe)
	h := b.handler(t, nil)
	for _, body := range []string{
		"origin=SFO&origin=LAX",
		"origin=SFO&origin[a]=1",
		"origin[a]=1&origin=SFO",
		"origin[a=1",
		"origin[a]x=1",
		"[a]=1",
		"items[1]=a",
		"items[0]=a&items[a]=b",
		"items[99999]=a",
		"origin=%zz",
		"origin=%FF",
		"metadata[%FF]=1&metadata[%FE]=2",
		"a0[999]=x&a1[999]=x&a2[999]=x&a3[999]=x",
		"a" + repeat("[a]", 40) + "=1",
	} {
		res := serve(h, formRequest("k-1", body))
		require.Equal(t, http.StatusBadRequest, res.Code, body)
		require.Equal(t, idemhttp.ProblemTypeBaseDefault+idemhttp.ProblemMalformedForm, decodeProblem(t, res).Type, body)
	}
	b.requireNothingWritten(t)

	ietf := setup(t, idemhttp.ProfileIETF)
	res := serve(ietf.handler(t, nil), formRequest("k-1", "origin=SFO&amount=20"))
	require.Equal(t, http.StatusUnsupportedMediaType, res.Code)
	require.Equal(t, "application/json", res.Header().Get("Accept-Post"))
	res = serve(h, func() *http.Request { r := request("k-1", "x"); r.Header.Set("Content-Type", "text/plain"); return r }())
	require.Equal(t, "application/json, application/x-www-form-urlencoded", res.Header().Get("Accept-Post"))
}

func repeat(s string, n int) string {
	out := ""
	for range n {
		out += s
	}
	return out
}
