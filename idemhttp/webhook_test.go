package idemhttp_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/internal/testfixture"
	"github.com/go-idem/idem/pgstore"
)

// hookBundle is what the webhook tests share: a schema of their own, a
// runner that counts its events, and a two-phase flow that books each
// event it is given into a ledger.
type hookBundle struct {
	pool    *pgxpool.Pool
	store   *pgstore.Store
	runner  *idem.Runner
	flow    *idem.Flow[hookEvent]
	counts  *testfixture.PhaseCounts
	logs    *testfixture.Buffer
	handler *idemhttp.Webhook[hookEvent]

	mu      sync.Mutex
	events  map[idem.EventKind]int
	blockMu sync.Mutex
	block   func(phase string) error
}

type hookEvent struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Account string `json:"account"`
	Amount  int    `json:"amount"`
}

const hookSecret = "whsec_test"

func sign(body string) string {
	mac := hmac.New(sha256.New, []byte(hookSecret))
	mac.Write([]byte(body))
	return hex.EncodeToString(mac.Sum(nil))
}

func verifyHook(r *http.Request, body []byte) error {
	got, err := hex.DecodeString(r.Header.Get("X-Signature"))
	if err != nil {
		return fmt.Errorf("signature is not hex: %w", err)
	}
	mac := hmac.New(sha256.New, []byte(hookSecret))
	mac.Write(body)
	if !hmac.Equal(got, mac.Sum(nil)) {
		return errors.New("signature does not match")
	}
	return nil
}

func setupWebhook(t *testing.T) *hookBundle {
	t.Helper()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	_, err := schema.Pool.Exec(ctx, `CREATE TABLE ledger (id bigserial PRIMARY KEY, key_id bigint, event_id text NOT NULL, amount int NOT NULL)`)
	require.NoError(t, err)
	store, err := pgstore.New(schema.Pool, &pgstore.Config{Schema: schema.Name})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	b := &hookBundle{pool: schema.Pool, store: store, counts: &testfixture.PhaseCounts{}, logs: &testfixture.Buffer{},
		events: map[idem.EventKind]int{}}
	step := func(phase string) error {
		b.counts.Add(phase)
		b.blockMu.Lock()
		block := b.block
		b.blockMu.Unlock()
		if block != nil {
			return block(phase)
		}
		return nil
	}
	b.flow = idem.MustNewFlow("payments.webhook", []idem.Phase[hookEvent]{
		{Name: "booked", Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[hookEvent]) (idem.Result, error) {
			if err := step("booked"); err != nil {
				return idem.Result{}, err
			}
			_, err := tx.Exec(ctx, `INSERT INTO ledger (key_id, event_id, amount) VALUES ($1, $2, $3)`,
				run.Key().ID, run.Input().ID, run.Input().Amount)
			return idem.Advance(), err
		}},
		{Name: "responded", Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[hookEvent]) (idem.Result, error) {
			if err := step("responded"); err != nil {
				return idem.Result{}, err
			}
			return idem.RespondJSON(http.StatusOK, map[string]any{"received": run.Input().ID}), nil
		}},
	}, &idem.FlowConfig[hookEvent]{Retention: 4 * 24 * time.Hour})
	b.runner, err = idem.NewRunner(store, &idem.Config{
		Flows:  []idem.AnyFlow{b.flow},
		Logger: slog.New(slog.NewTextHandler(b.logs, nil)),
		Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.events[e.Kind]++
		}),
	})
	require.NoError(t, err)
	b.handler, err = idemhttp.NewWebhook(b.runner, b.flow, &idemhttp.WebhookConfig{
		Provider: "payments",
		Account:  idemhttp.Optional(idemhttp.JSONValue("account"), ""),
		EventID:  idemhttp.JSONValue("id"),
		Verify:   verifyHook,
	})
	require.NoError(t, err)
	return b
}

func (b *hookBundle) setBlock(f func(phase string) error) {
	b.blockMu.Lock()
	defer b.blockMu.Unlock()
	b.block = f
}

func (b *hookBundle) eventCount(kind idem.EventKind) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.events[kind]
}

// deliver posts body to the receiver, signed unless signature is given.
func (b *hookBundle) deliver(body string, signature ...string) *httptest.ResponseRecorder {
	r := signedRequest(body)
	if len(signature) > 0 {
		r.Header.Set("X-Signature", signature[0])
	}
	return serve(b.handler, r)
}

// signedRequest is a delivery of body with a good signature.
func signedRequest(body string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/webhooks/payments", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("X-Signature", sign(body))
	return r
}

func (b *hookBundle) ledger(t *testing.T, eventID string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM ledger WHERE event_id = $1`, eventID).Scan(&n))
	return n
}

func requireWebhookProblem(t *testing.T, res *httptest.ResponseRecorder, status int, name string) {
	t.Helper()
	require.Equal(t, status, res.Code, "body: %s", res.Body)
	p := decodeProblem(t, res)
	require.Equal(t, idemhttp.ProblemTypeBaseDefault+name, p.Type)
	require.Equal(t, status, p.Status)
	require.NotEmpty(t, p.Detail)
}

// An event runs once; its redelivery gets the stored 2xx and runs nothing;
// the same id with another body is refused, logged and counted.
func TestWebhookRunsAnEventOnce(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t)
	const event = `{"id": "evt_1", "type": "charge.succeeded", "amount": 500}`

	first := b.deliver(event)
	require.Equal(t, http.StatusOK, first.Code, "body: %s", first.Body)
	require.JSONEq(t, `{"received": "evt_1"}`, first.Body.String())
	require.Empty(t, first.Header().Get("Idempotent-Replayed"))

	// The same event, as a provider redelivers it: the body's members in
	// another order and other white space are the same body.
	again := b.deliver(`{"type":"charge.succeeded","amount":500,"id":"evt_1"}`)
	require.Equal(t, http.StatusOK, again.Code)
	require.Equal(t, first.Body.Bytes(), again.Body.Bytes())
	require.Equal(t, "true", again.Header().Get("Idempotent-Replayed"))
	require.Equal(t, map[string]int{"booked": 1, "responded": 1}, b.counts.Get())
	require.Equal(t, 1, b.ledger(t, "evt_1"))

	other := b.deliver(`{"id": "evt_1", "type": "charge.succeeded", "amount": 900}`)
	requireWebhookProblem(t, other, http.StatusUnprocessableEntity, idemhttp.ProblemWebhookEventReused)
	require.Equal(t, 1, b.eventCount(idem.EventMismatch))
	require.Contains(t, b.logs.String(), "webhook event delivered again with another body")
	require.NotContains(t, b.logs.String(), "evt_1", "the event id only with the runner's LogKeys")
	require.Contains(t, b.logs.String(), `first used by flow \"payments.webhook\" at POST /webhooks/payments`)
	require.Equal(t, 1, b.ledger(t, "evt_1"))

	// The same event delivered to another route is another request.
	moved := signedRequest(event)
	moved.URL.Path = "/webhooks/payments-v2"
	requireWebhookProblem(t, serve(b.handler, moved), http.StatusUnprocessableEntity, idemhttp.ProblemWebhookEventReused)
	require.Equal(t, 2, b.eventCount(idem.EventMismatch))
	require.Equal(t, map[string]int{"booked": 1, "responded": 1}, b.counts.Get())

	// The key is the event id, in the provider's scope.
	rec, err := b.store.GetKey(context.Background(), b.handler.Scope(""), "evt_1")
	require.NoError(t, err)
	require.Equal(t, idemtype.StoredFinished, rec.Status)
	require.Equal(t, "webhook:payments", b.handler.Scope(""))
	require.Equal(t, "webhook:payments/acct_9", b.handler.Scope("acct_9"))
}

// A delivery that fails Verify, or whose event cannot be identified, is
// refused before anything is stored or run.
func TestWebhookRefusesBeforeStoringAnything(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t)
	const event = `{"id": "evt_2", "type": "charge.succeeded", "amount": 500}`

	requireWebhookProblem(t, b.deliver(event, sign(`{"id": "evt_2"}`)), http.StatusBadRequest, idemhttp.ProblemWebhookSignatureInvalid)
	requireWebhookProblem(t, b.deliver(event, "not hex"), http.StatusBadRequest, idemhttp.ProblemWebhookSignatureInvalid)
	require.Contains(t, b.logs.String(), "webhook signature refused")
	requireWebhookProblem(t, b.deliver(`{"type": "ping"}`), http.StatusBadRequest, idemhttp.ProblemWebhookEventInvalid)
	requireWebhookProblem(t, b.deliver(`{"id": 7}`), http.StatusBadRequest, idemhttp.ProblemWebhookEventInvalid)
	requireWebhookProblem(t, b.deliver(`{"id": "evt\u00e9"}`), http.StatusBadRequest, idemhttp.ProblemWebhookEventInvalid)
	requireWebhookProblem(t, b.deliver(`{"id": "evt_2", "account": 5}`), http.StatusBadRequest, idemhttp.ProblemWebhookEventInvalid)
	requireWebhookProblem(t, b.deliver(`["evt_2"]`), http.StatusBadRequest, idemhttp.ProblemWebhookEventInvalid)
	// A signed delivery the receiver cannot identify is the provider's,
	// which will send it again: the operator sees it.
	require.Contains(t, b.logs.String(), "level=WARN msg=\"idemhttp: webhook event cannot be identified; nothing was recorded\"")
	requireWebhookProblem(t, b.deliver(`{"id": "evt_2", "amount": "lots"}`), http.StatusUnprocessableEntity, idemhttp.ProblemInvalidInput)
	requireWebhookProblem(t, b.deliver(strings.Repeat(" ", idemhttp.MaxBodyBytesDefault+1)), http.StatusRequestEntityTooLarge, idemhttp.ProblemBodyTooLarge)

	get := serve(b.handler, httptest.NewRequest(http.MethodGet, "/webhooks/payments", nil))
	requireWebhookProblem(t, get, http.StatusMethodNotAllowed, idemhttp.ProblemMethodNotAllowed)
	require.Equal(t, "POST", get.Header().Get("Allow"))

	var keys int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM idem_keys`).Scan(&keys))
	require.Zero(t, keys)
	require.Empty(t, b.counts.Get())

	// The same event, signed: it runs, and members the input type does
	// not have are ignored (providers add them without notice).
	ok := b.deliver(`{"id": "evt_2", "type": "charge.succeeded", "amount": 500, "livemode": false}`)
	require.Equal(t, http.StatusOK, ok.Code, "body: %s", ok.Body)
	require.Equal(t, 1, b.ledger(t, "evt_2"))
}

// The same event id from two accounts is two events.
func TestWebhookAccountsAreScopes(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t)
	for _, account := range []string{"acct_a", "acct_b"} {
		res := b.deliver(fmt.Sprintf(`{"id": "evt_3", "account": %q, "amount": 100}`, account))
		require.Equal(t, http.StatusOK, res.Code, "body: %s", res.Body)
		require.Empty(t, res.Header().Get("Idempotent-Replayed"))
		rec, err := b.store.GetKey(context.Background(), b.handler.Scope(account), "evt_3")
		require.NoError(t, err)
		require.Equal(t, idemtype.StoredFinished, rec.Status)
	}
	require.Equal(t, 2, b.ledger(t, "evt_3"))
}

// A redelivery while the event runs is a 503 with Retry-After, which a
// provider that redelivers delivers again; the redelivery after it finished gets the stored
// response.
func TestWebhookRedeliveryWhileRunning(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t)
	pause := testfixture.NewPause(t)
	b.setBlock(func(phase string) error {
		if phase == "responded" {
			pause.Hold(context.Background())
		}
		return nil
	})
	const event = `{"id": "evt_4", "amount": 250}`
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- b.deliver(event) }()
	select {
	case <-pause.Reached():
	case <-time.After(time.Minute):
		t.Fatal("the first delivery never reached its last phase")
	}

	busy := b.deliver(event)
	requireWebhookProblem(t, busy, http.StatusServiceUnavailable, idemhttp.ProblemWebhookEventInProgress)
	require.NotEmpty(t, busy.Header().Get("Retry-After"))

	pause.Release()
	first := <-done
	require.Equal(t, http.StatusOK, first.Code, "body: %s", first.Body)
	again := b.deliver(event)
	require.Equal(t, first.Body.Bytes(), again.Body.Bytes())
	require.Equal(t, "true", again.Header().Get("Idempotent-Replayed"))
	require.Equal(t, 1, b.ledger(t, "evt_4"))
	require.Equal(t, 1, b.eventCount(idem.EventInProgress))
}

// A phase that fails answers 500 and keeps what committed: the
// redelivery resumes after it, and the ledger has one entry.
func TestWebhookFailedPhaseResumesOnRedelivery(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t)
	b.setBlock(func(phase string) error {
		if phase == "responded" {
			return errors.New("the notification service is down")
		}
		return nil
	})
	const event = `{"id": "evt_5", "amount": 75}`
	requireWebhookProblem(t, b.deliver(event), http.StatusInternalServerError, idemhttp.ProblemRequestFailed)
	b.setBlock(nil)
	res := b.deliver(event)
	require.Equal(t, http.StatusOK, res.Code, "body: %s", res.Body)
	require.Equal(t, map[string]int{"booked": 1, "responded": 2}, b.counts.Get())
	require.Equal(t, 1, b.ledger(t, "evt_5"))
}

// NewWebhook refuses what it cannot run safely: no way to identify or
// verify an event, a retention shorter than the provider's redelivery
// window.
func TestNewWebhookConfig(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t)
	valid := func() *idemhttp.WebhookConfig {
		return &idemhttp.WebhookConfig{Provider: "stripe", EventID: idemhttp.JSONValue("id"), Verify: verifyHook}
	}
	for _, tc := range []struct {
		adjust func(*idemhttp.WebhookConfig)
		want   string
	}{
		{func(c *idemhttp.WebhookConfig) { c.Provider = "" }, "Provider"},
		{func(c *idemhttp.WebhookConfig) { c.Provider = "Stripe/EU" }, "Provider"},
		{func(c *idemhttp.WebhookConfig) { c.EventID = nil }, "EventID is required"},
		{func(c *idemhttp.WebhookConfig) { c.Verify = nil }, "Verify is required"},
		{func(c *idemhttp.WebhookConfig) { c.MaxBodyBytes = -1 }, "MaxBodyBytes"},
		{func(c *idemhttp.WebhookConfig) { c.RedeliveryWindow = -time.Hour }, "RedeliveryWindow"},
		{func(c *idemhttp.WebhookConfig) { c.RedeliveryWindow = 5 * 24 * time.Hour }, "set the flow's FlowConfig.Retention"},
		{func(c *idemhttp.WebhookConfig) { c.ReplayHeaders = []string{"Set-Cookie"} }, "never replayed"},
	} {
		cfg := valid()
		tc.adjust(cfg)
		_, err := idemhttp.NewWebhook(b.runner, b.flow, cfg)
		require.ErrorContains(t, err, tc.want)
	}
	_, err := idemhttp.NewWebhook(b.runner, b.flow, nil)
	require.Error(t, err)
	_, err = idemhttp.NewWebhook(b.runner, b.flow, valid())
	require.NoError(t, err)

	// The runner's defaults keep finished keys 24 h: too short for the
	// default window of 72 h.
	short := idem.MustNewFlow("short.webhook", []idem.Phase[hookEvent]{{Name: "responded",
		Do: func(context.Context, idem.Tx, *idem.Attempt[hookEvent]) (idem.Result, error) {
			return idem.RespondJSON(http.StatusOK, nil), nil
		}}}, &idem.FlowConfig[hookEvent]{UnfinishedRetention: time.Hour})
	shortRunner, err := idem.NewRunner(b.store, &idem.Config{Flows: []idem.AnyFlow{short}})
	require.NoError(t, err)
	_, err = idemhttp.NewWebhook(shortRunner, short, valid())
	require.ErrorContains(t, err, "keeps the flow's finished keys for 24h0m0s, less than RedeliveryWindow 72h0m0s")
	require.ErrorContains(t, err, "abandons the flow's unfinished keys after 1h0m0s")
	cfg := valid()
	cfg.RedeliveryWindow = time.Hour
	_, err = idemhttp.NewWebhook(shortRunner, short, cfg)
	require.NoError(t, err)
}

// The value readers.
func TestWebhookValues(t *testing.T) {
	t.Parallel()
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set("X-GitHub-Delivery", "72d3162e")
	v, err := idemhttp.HeaderValue("x-github-delivery")(r, nil)
	require.NoError(t, err)
	require.Equal(t, "72d3162e", v)
	_, err = idemhttp.HeaderValue("X-Missing")(r, nil)
	require.ErrorIs(t, err, idemhttp.ErrWebhookValueMissing)

	body := []byte(`{"id": "evt_1", "data": {"object": {"id": "ch_1", "n": 3}}, "account": null}`)
	for _, tc := range []struct {
		path    []string
		want    string
		missing bool
		err     string
	}{
		{path: []string{"id"}, want: "evt_1"},
		{path: []string{"data", "object", "id"}, want: "ch_1"},
		{path: []string{"account"}, missing: true},
		{path: []string{"nope"}, missing: true},
		{path: []string{"data", "object", "n"}, err: "not a string"},
		{path: []string{"id", "x"}, err: "not a JSON object"},
	} {
		v, err := idemhttp.JSONValue(tc.path...)(r, body)
		switch {
		case tc.missing:
			require.ErrorIs(t, err, idemhttp.ErrWebhookValueMissing, "%v", tc.path)
			v, err = idemhttp.Optional(idemhttp.JSONValue(tc.path...), "fallback")(r, body)
			require.NoError(t, err)
			require.Equal(t, "fallback", v)
		case tc.err != "":
			require.ErrorContains(t, err, tc.err, "%v", tc.path)
			require.NotErrorIs(t, err, idemhttp.ErrWebhookValueMissing)
			_, err = idemhttp.Optional(idemhttp.JSONValue(tc.path...), "fallback")(r, body)
			require.Error(t, err)
		default:
			require.NoError(t, err)
			require.Equal(t, tc.want, v)
		}
	}
}

// A redelivery that this release can no longer decode (the input type
// changed under it) is answered from the event's key: the stored response,
// not a 422 the provider would redeliver for days.
func TestWebhookRedeliveryAfterADeployThatCannotDecodeIt(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t)
	const event = `{"id": "evt_6", "amount": 300}`
	first := b.deliver(event)
	require.Equal(t, http.StatusOK, first.Code, "body: %s", first.Body)

	type eventV2 struct {
		ID     string `json:"id"`
		Amount string `json:"amount"` // was a number
	}
	v2 := idem.MustNewFlow(b.flow.Name(), []idem.Phase[eventV2]{
		{Name: "booked", Do: func(context.Context, idem.Tx, *idem.Attempt[eventV2]) (idem.Result, error) {
			return idem.Result{}, errors.New("must not run")
		}},
		{Name: "responded", Do: func(context.Context, idem.Tx, *idem.Attempt[eventV2]) (idem.Result, error) {
			return idem.Result{}, errors.New("must not run")
		}},
	}, &idem.FlowConfig[eventV2]{Retention: 4 * 24 * time.Hour})
	runner, err := idem.NewRunner(b.store, &idem.Config{Flows: []idem.AnyFlow{v2}})
	require.NoError(t, err)
	h, err := idemhttp.NewWebhook(runner, v2, &idemhttp.WebhookConfig{Provider: "payments", EventID: idemhttp.JSONValue("id"), Verify: verifyHook})
	require.NoError(t, err)
	again := serve(h, signedRequest(event))
	require.Equal(t, http.StatusOK, again.Code, "body: %s", again.Body)
	require.Equal(t, first.Body.Bytes(), again.Body.Bytes())
	require.Equal(t, "true", again.Header().Get("Idempotent-Replayed"))

	// A new event this release cannot decode is its problem.
	res := serve(h, signedRequest(`{"id": "evt_7", "amount": 300}`))
	requireWebhookProblem(t, res, http.StatusUnprocessableEntity, idemhttp.ProblemInvalidInput)
	require.Equal(t, 1, b.ledger(t, "evt_6"))
	require.Zero(t, b.ledger(t, "evt_7"))
}

// A webhook's keys live in scopes no other handler can make: a Handler
// whose Scope is named like the provider cannot take an event id before
// the provider delivers it, and one whose Scope returns a webhook scope is
// refused.
func TestWebhookScopesAreReserved(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t)
	notes := idem.MustNewFlow("notes.create", []idem.Phase[hookEvent]{{Name: "responded",
		Do: func(context.Context, idem.Tx, *idem.Attempt[hookEvent]) (idem.Result, error) {
			return idem.RespondJSON(http.StatusCreated, map[string]any{"ok": true}), nil
		}}}, nil)
	runner, err := idem.NewRunner(b.store, &idem.Config{Flows: []idem.AnyFlow{b.flow, notes},
		Logger: slog.New(slog.NewTextHandler(b.logs, nil))})
	require.NoError(t, err)
	// The scope is a user name the caller chose.
	h, err := idemhttp.New(runner, notes, &idemhttp.Config[hookEvent]{
		Scope:              func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil },
		AllowUnknownFields: true,
	})
	require.NoError(t, err)
	note := func(user string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/notes", strings.NewReader(`{"id": "x"}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", "evt_42")
		r.Header.Set("X-User", user)
		return serve(h, r)
	}
	for _, user := range []string{"payments", "payments/acct_9"} {
		res := note(user)
		require.Equal(t, http.StatusCreated, res.Code, "body: %s", res.Body)
	}
	for _, user := range []string{"webhook:payments", "webhook:payments/acct_9", "webhook:"} {
		requireWebhookProblem(t, note(user), http.StatusInternalServerError, idemhttp.ProblemInternal)
	}
	require.Contains(t, b.logs.String(), "Config.Scope returned a scope reserved for webhook receivers")
	var keys int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM idem_keys WHERE scope LIKE 'webhook:%'`).Scan(&keys))
	require.Zero(t, keys)

	// The provider's events run, in the provider's account and without.
	for _, event := range []string{`{"id": "evt_42", "amount": 500}`, `{"id": "evt_42", "account": "acct_9", "amount": 500}`} {
		res := b.deliver(event)
		require.Equal(t, http.StatusOK, res.Code, "body: %s", res.Body)
		require.Empty(t, res.Header().Get("Idempotent-Replayed"))
	}
	require.Equal(t, 2, b.ledger(t, "evt_42"))
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM idem_keys WHERE key = 'evt_42'`).Scan(&keys))
	require.Equal(t, 4, keys)
}

// A body that does not decode, delivered under the id of an event that
// ran with another body, is the event id reused, as for one that decodes:
// refused 422 webhook-event-reused, logged and counted.
func TestWebhookUndecodableBodyUnderAnotherEventsID(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t)
	require.Equal(t, http.StatusOK, b.deliver(`{"id": "evt_9", "amount": 1}`).Code)
	res := b.deliver(`{"id": "evt_9", "amount": "two"}`)
	requireWebhookProblem(t, res, http.StatusUnprocessableEntity, idemhttp.ProblemWebhookEventReused)
	require.Equal(t, 1, b.eventCount(idem.EventMismatch))
	require.Contains(t, b.logs.String(), "webhook event delivered again with another body")
	require.NotContains(t, b.logs.String(), "evt_9", "the event id only with the runner's LogKeys")
	require.Equal(t, 1, b.ledger(t, "evt_9"))
}

// WebhookConfig.Content says what is compared between deliveries: a
// provider that counts its attempts in the body gets the stored response
// for every redelivery, while a change elsewhere is still refused.
func TestWebhookContent(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t)
	withoutAttempt := func(_ *http.Request, body []byte) ([]byte, error) {
		var members map[string]json.RawMessage
		if err := json.Unmarshal(body, &members); err != nil {
			return nil, err
		}
		delete(members, "attempt")
		return json.Marshal(members)
	}
	h, err := idemhttp.NewWebhook(b.runner, b.flow, &idemhttp.WebhookConfig{
		Provider: "payments", EventID: idemhttp.JSONValue("id"), Verify: verifyHook, Content: withoutAttempt,
	})
	require.NoError(t, err)
	first := serve(h, signedRequest(`{"id": "evt_c", "amount": 10, "attempt": 1}`))
	require.Equal(t, http.StatusOK, first.Code, "body: %s", first.Body)
	for attempt := 2; attempt <= 4; attempt++ {
		again := serve(h, signedRequest(fmt.Sprintf(`{"id": "evt_c", "amount": 10, "attempt": %d}`, attempt)))
		require.Equal(t, http.StatusOK, again.Code, "body: %s", again.Body)
		require.Equal(t, "true", again.Header().Get("Idempotent-Replayed"))
		require.Equal(t, first.Body.Bytes(), again.Body.Bytes())
	}
	requireWebhookProblem(t, serve(h, signedRequest(`{"id": "evt_c", "amount": 11, "attempt": 5}`)),
		http.StatusUnprocessableEntity, idemhttp.ProblemWebhookEventReused)
	require.Equal(t, 1, b.ledger(t, "evt_c"))

	// Without Content, the whole body is compared.
	require.Equal(t, http.StatusOK, b.deliver(`{"id": "evt_d", "amount": 10, "attempt": 1}`).Code)
	requireWebhookProblem(t, b.deliver(`{"id": "evt_d", "amount": 10, "attempt": 2}`),
		http.StatusUnprocessableEntity, idemhttp.ProblemWebhookEventReused)

	// Content that fails refuses the delivery before anything is stored.
	failing, err := idemhttp.NewWebhook(b.runner, b.flow, &idemhttp.WebhookConfig{
		Provider: "payments", EventID: idemhttp.JSONValue("id"), Verify: verifyHook,
		Content: func(*http.Request, []byte) ([]byte, error) { return nil, errors.New("no content") },
	})
	require.NoError(t, err)
	res := serve(failing, signedRequest(`{"id": "evt_e", "amount": 1}`))
	require.Contains(t, res.Body.String(), "content could not be read: no content", "refused by Content, not earlier")
	requireWebhookProblem(t, res, http.StatusBadRequest, idemhttp.ProblemWebhookEventInvalid)
	// Content that is not JSON is the application's mistake, answered as
	// one: 400 with nothing stored, not a 500 from the fingerprint.
	notJSON, err := idemhttp.NewWebhook(b.runner, b.flow, &idemhttp.WebhookConfig{
		Provider: "payments", EventID: idemhttp.JSONValue("id"), Verify: verifyHook,
		Content: func(*http.Request, []byte) ([]byte, error) { return []byte("evt_e;1"), nil },
	})
	require.NoError(t, err)
	res = serve(notJSON, signedRequest(`{"id": "evt_e", "amount": 1}`))
	require.Contains(t, res.Body.String(), "Content returned something that is not JSON")
	requireWebhookProblem(t, res, http.StatusBadRequest, idemhttp.ProblemWebhookEventInvalid)
	require.Zero(t, b.ledger(t, "evt_e"))
}

// The Handler's answers a webhook shares, as docs/webhooks.md lists them:
// Config.Admit's refusal is a 429, and a panic in the receiver's own
// functions a 500, with nothing stored.
func TestWebhookAdmitAndPanics(t *testing.T) {
	t.Parallel()
	b := setupWebhook(t)
	full, err := idem.NewRunner(b.store, &idem.Config{Flows: []idem.AnyFlow{b.flow},
		Admit: func(context.Context, string, string) error { return idem.TooManyKeys(30 * time.Second) }})
	require.NoError(t, err)
	h, err := idemhttp.NewWebhook(full, b.flow, &idemhttp.WebhookConfig{Provider: "payments", EventID: idemhttp.JSONValue("id"), Verify: verifyHook})
	require.NoError(t, err)
	res := serve(h, signedRequest(`{"id": "evt_a", "amount": 1}`))
	requireWebhookProblem(t, res, http.StatusTooManyRequests, idemhttp.ProblemTooManyKeys)
	require.Equal(t, "30", res.Header().Get("Retry-After"))

	for name, cfg := range map[string]*idemhttp.WebhookConfig{
		"Verify":  {Verify: func(*http.Request, []byte) error { panic("Verify") }, EventID: idemhttp.JSONValue("id")},
		"EventID": {Verify: verifyHook, EventID: func(*http.Request, []byte) (string, error) { panic("EventID") }},
		"Account": {Verify: verifyHook, EventID: idemhttp.JSONValue("id"), Account: func(*http.Request, []byte) (string, error) { panic("Account") }},
		"Content": {Verify: verifyHook, EventID: idemhttp.JSONValue("id"), Content: func(*http.Request, []byte) ([]byte, error) { panic("Content") }},
	} {
		cfg.Provider = "payments"
		h, err := idemhttp.NewWebhook(b.runner, b.flow, cfg)
		require.NoError(t, err)
		requireWebhookProblem(t, serve(h, signedRequest(`{"id": "evt_p", "amount": 1}`)), http.StatusInternalServerError, idemhttp.ProblemInternal)
		require.Contains(t, b.logs.String(), "panic="+name, name)
	}
	var keys int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM idem_keys`).Scan(&keys))
	require.Zero(t, keys)
}
