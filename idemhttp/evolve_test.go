package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/pgstore"
)

// The input types of one endpoint across deploys.
type orderV1 struct {
	SKU string `json:"sku"`
}

type orderV2 struct {
	SKU  string `json:"sku"`
	Note string `json:"note"` // added by a deploy, no omitempty
}

type orderQty struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

type orderQtyRenamed struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"` // the tag was "quantity"
}

// evolveFlow is the endpoint's flow for one build: a phase that advances,
// then one that answers 201 with the input it sees.
func evolveFlow[In any]() *idem.Flow[In] {
	return idem.MustNewFlow("orders.create", []idem.Phase[In]{
		{Name: "received", Do: func(context.Context, idem.Tx, *idem.Attempt[In]) (idem.Result, error) {
			return idem.Advance(), nil
		}},
		{Name: "done", Do: func(_ context.Context, _ idem.Tx, run *idem.Attempt[In]) (idem.Result, error) {
			return idem.RespondJSON(http.StatusCreated, map[string]any{"ok": true, "input": run.Input()}), nil
		}},
	}, nil)
}

// evolveServer is one build of the service on schema s, as a deploy runs it.
func evolveServer[In any](t *testing.T, s *idemtest.Schema, adjust func(*idemhttp.Config[In])) http.Handler {
	t.Helper()
	return evolveServerWith(t, s, &idem.Config{}, adjust)
}

// evolveServerWith is evolveServer with the runner's configuration.
func evolveServerWith[In any](t *testing.T, s *idemtest.Schema, cfg *idem.Config, adjust func(*idemhttp.Config[In])) http.Handler {
	t.Helper()
	store, err := pgstore.New(s.Pool, nil)
	require.NoError(t, err)
	f := evolveFlow[In]()
	cfg.Flows = []idem.AnyFlow{f}
	r, err := idem.NewRunner(store, cfg)
	require.NoError(t, err)
	hcfg := &idemhttp.Config[In]{Scope: func(*http.Request) (string, error) { return "u1", nil }}
	if adjust != nil {
		adjust(hcfg)
	}
	h, err := idemhttp.New(r, f, hcfg)
	require.NoError(t, err)
	return h
}

func sendOrder(h http.Handler, target, key, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, target, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", `"`+key+`"`)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// A retry of the same bytes under the same key after a deploy that added a
// field to the input is the same request: replayed, not 422.
func TestRetryAcrossDeployThatAddsAField(t *testing.T) {
	t.Parallel()
	s := idemtest.NewSchema(t)
	body := `{"sku":"A-1"}`
	w1 := sendOrder(evolveServer[orderV1](t, s, nil), "/orders", "k-evolve-1", body)
	t.Logf("before the deploy: %d %s", w1.Code, w1.Body.String())
	w2 := sendOrder(evolveServer[orderV2](t, s, nil), "/orders", "k-evolve-1", body)
	t.Logf("same bytes, same key, after the deploy: %d %s", w2.Code, w2.Body.String())
	require.Equal(t, http.StatusCreated, w1.Code)
	require.Equal(t, w1.Code, w2.Code)
	require.Equal(t, w1.Body.String(), w2.Body.String())

	// The same key with another payload is still a different request.
	w3 := sendOrder(evolveServer[orderV2](t, s, nil), "/orders", "k-evolve-1", `{"sku":"A-2"}`)
	t.Logf("other bytes, same key, after the deploy: %d", w3.Code)
	require.Equal(t, http.StatusUnprocessableEntity, w3.Code)
	w4 := sendOrder(evolveServer[orderV2](t, s, nil), "/orders", "k-evolve-1", `{"sku":"A-1","note":"x"}`)
	require.Equal(t, http.StatusUnprocessableEntity, w4.Code, "a value for the new field is another payload")
	// Another query string is another request too (Prepare may read it).
	w5 := sendOrder(evolveServer[orderV2](t, s, nil), "/orders?express=1", "k-evolve-1", body)
	require.Equal(t, http.StatusUnprocessableEntity, w5.Code)
	// What is spelt differently but means the same is the same payload.
	w6 := sendOrder(evolveServer[orderV2](t, s, nil), "/orders", "k-evolve-1", "{ \"sku\" : \"A\\u002d1\" }")
	require.Equal(t, http.StatusCreated, w6.Code)
}

// A deploy that renames a field's JSON tag, or changes what Prepare fills
// in, does not change the fingerprint of the bytes a client sends.
func TestRetryAcrossDeployThatRenamesATagOrChangesPrepare(t *testing.T) {
	t.Parallel()
	s := idemtest.NewSchema(t)
	body := `{"sku":"A-1","quantity":2}`
	w1 := sendOrder(evolveServer[orderQty](t, s, nil), "/orders", "k-tag", body)
	require.Equal(t, http.StatusCreated, w1.Code)
	lenient := func(c *idemhttp.Config[orderQtyRenamed]) { c.AllowUnknownFields = true }
	w2 := sendOrder(evolveServer(t, s, lenient), "/orders", "k-tag", body)
	t.Logf("renamed tag: %d %s", w2.Code, w2.Body.String())
	require.Equal(t, http.StatusCreated, w2.Code)

	w3 := sendOrder(evolveServer[orderV2](t, s, nil), "/orders", "k-prepare", `{"sku":"A-1"}`)
	require.Equal(t, http.StatusCreated, w3.Code)
	fills := func(c *idemhttp.Config[orderV2]) {
		c.Prepare = func(_ *http.Request, in *orderV2) error { in.Note = "filled in by the server"; return nil }
	}
	w4 := sendOrder(evolveServer(t, s, fills), "/orders", "k-prepare", `{"sku":"A-1"}`)
	t.Logf("Prepare fills in a field: %d %s", w4.Code, w4.Body.String())
	require.Equal(t, http.StatusCreated, w4.Code)
}

// With the default strict decoding, a deploy that renames a field's tag or
// removes a field makes the old body undecodable ("quantity is not a known
// field"). A retry of those bytes is still its request: a finished key is
// replayed and a key in flight is resumed from its stored input. The same
// body under a key that does not exist, or that another body made, still
// gets the decoding's 422.
func TestRetryOfABodyTheNewReleaseCannotDecode(t *testing.T) {
	t.Parallel()
	s := idemtest.NewSchema(t)
	body := `{"sku":"A-1","quantity":2}`
	w1 := sendOrder(evolveServer[orderQty](t, s, nil), "/orders", "k-strict", body)
	require.Equal(t, http.StatusCreated, w1.Code)

	after := evolveServer[orderQtyRenamed](t, s, nil)
	w2 := sendOrder(after, "/orders", "k-strict", body)
	t.Logf("renamed tag, strict decoding, finished key: %d %s", w2.Code, w2.Body.String())
	require.Equal(t, http.StatusCreated, w2.Code)
	require.Equal(t, w1.Body.String(), w2.Body.String())
	require.Equal(t, "true", w2.Header().Get("Idempotent-Replayed"))

	w3 := sendOrder(after, "/orders", "k-new", body)
	t.Logf("the same body under a new key: %d %s", w3.Code, w3.Body.String())
	require.Equal(t, http.StatusUnprocessableEntity, w3.Code)
	require.Contains(t, w3.Body.String(), "quantity")
	w4 := sendOrder(after, "/orders", "k-strict", `{"sku":"A-1","quantity":3}`)
	require.Equal(t, http.StatusUnprocessableEntity, w4.Code)
	require.Contains(t, w4.Body.String(), "quantity", "the decoding's own problem, not the reused key's")

	// Validation that a deploy tightened: the same.
	strict := evolveServer(t, s, func(c *idemhttp.Config[orderQty]) {
		c.Validate = func(in *orderQty) []idemhttp.FieldError {
			if in.Quantity < 5 {
				return []idemhttp.FieldError{{Field: "quantity", Detail: "must be at least 5"}}
			}
			return nil
		}
	})
	w5 := sendOrder(strict, "/orders", "k-strict", body)
	require.Equal(t, http.StatusCreated, w5.Code)
	w6 := sendOrder(strict, "/orders", "k-other", body)
	require.Equal(t, http.StatusUnprocessableEntity, w6.Code)
}

// A request in flight when the deploy happens (its server crashed after
// the first phase) is resumed by the retry of its bytes on the new build:
// with a field added to the input, and with strict decoding after a tag
// was renamed (from the stored input, decoded tolerantly).
func TestRetryResumesAKeyInFlightAcrossADeploy(t *testing.T) {
	t.Parallel()
	s := idemtest.NewSchema(t)
	clock := idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	crash := func(_ context.Context, at idemtest.HookPoint) error {
		if at.Where == idemtest.HookPhaseStart && at.Phase == "done" {
			return idemtest.ErrSimulatedCrash
		}
		return nil
	}
	before := evolveServerWith[orderQty](t, s, &idem.Config{Test: idemtest.WithHook(idem.TestConfig{Now: clock.Now}, crash)}, nil)
	body := `{"sku":"A-1","quantity":2}`
	for _, key := range []string{"k-added", "k-renamed"} {
		require.Panics(t, func() { sendOrder(before, "/orders", key, body) }, "the crash drops the connection")
	}
	clock.Advance(time.Hour)

	type orderQtyNote struct {
		orderQty
		Note string `json:"note"`
	}
	added := evolveServerWith[orderQtyNote](t, s, &idem.Config{Test: idem.TestConfig{Now: clock.Now}}, nil)
	w := sendOrder(added, "/orders", "k-added", body)
	t.Logf("in flight, field added: %d %s", w.Code, w.Body.String())
	require.Equal(t, http.StatusCreated, w.Code)
	require.JSONEq(t, `{"ok":true,"input":{"sku":"A-1","quantity":2,"note":""}}`, w.Body.String())

	renamed := evolveServerWith[orderQtyRenamed](t, s, &idem.Config{Test: idem.TestConfig{Now: clock.Now}}, nil)
	w = sendOrder(renamed, "/orders", "k-renamed", body)
	t.Logf("in flight, tag renamed, strict decoding: %d %s", w.Code, w.Body.String())
	require.Equal(t, http.StatusCreated, w.Code)
	require.JSONEq(t, `{"ok":true,"input":{"sku":"A-1","qty":0}}`, w.Body.String(), "the stored input, decoded tolerantly")
}

// Bodies that share canonical bytes with a key's request but decode
// differently are never taken for its retry: a number spelled 2.0 for an
// integer field is refused as it is, before any key is read, and member names
// that differ only in case are refused whatever their order. Either would
// otherwise replay another client's answer without the checks Prepare makes.
func TestBodiesThatOnlyLookLikeARetryAreRefused(t *testing.T) {
	t.Parallel()
	s := idemtest.NewSchema(t)
	h := evolveServer[orderQty](t, s, nil)
	w1 := sendOrder(h, "/orders", "k-alice", `{"sku":"A-1","quantity":2}`)
	require.Equal(t, http.StatusCreated, w1.Code)

	w2 := sendOrder(h, "/orders", "k-alice", `{"sku":"A-1","quantity":2.0}`)
	t.Logf("2.0 for an integer: %d %s", w2.Code, w2.Body.String())
	require.Equal(t, http.StatusUnprocessableEntity, w2.Code)
	require.Empty(t, w2.Header().Get("Idempotent-Replayed"))
	require.Contains(t, w2.Body.String(), "quantity")

	w3 := sendOrder(h, "/orders", "k-case", `{"sku":"A-1","quantity":1,"QUANTITY":5}`)
	w4 := sendOrder(h, "/orders", "k-case", `{"sku":"A-1","QUANTITY":5,"quantity":1}`)
	t.Logf("case variants: %d then %d %s", w3.Code, w4.Code, w4.Body.String())
	require.Empty(t, w4.Header().Get("Idempotent-Replayed"))
	require.NotEqual(t, http.StatusCreated, w4.Code)
}
