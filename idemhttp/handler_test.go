package idemhttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
	"github.com/go-idem/idem/idemtest"
)

// Concurrent identical requests through a real server: one execution, every
// other caller gets the replay or a 409 with Retry-After.
func TestConcurrentIdenticalRequestsExecuteOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	mux := http.NewServeMux()
	mux.Handle("POST /rides", b.handler(t, nil))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	const callers = 16
	type result struct {
		status     int
		replayed   string
		retryAfter string
		body       string
	}
	start := make(chan struct{})
	results := make(chan result, callers)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			<-start
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/rides", strings.NewReader(rideBody))
			if err != nil {
				results <- result{body: err.Error()}
				return
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", testAuth)
			req.Header.Set("Idempotency-Key", `"storm"`)
			res, err := srv.Client().Do(req)
			if err != nil {
				results <- result{body: err.Error()}
				return
			}
			defer res.Body.Close()
			body, _ := io.ReadAll(res.Body)
			results <- result{res.StatusCode, res.Header.Get("Idempotent-Replayed"), res.Header.Get("Retry-After"), string(body)}
		})
	}
	close(start)
	wg.Wait()
	close(results)

	executed, replayed, inProgress := 0, 0, 0
	var firstBody string
	for res := range results {
		switch {
		case res.status == http.StatusCreated && res.replayed == "":
			executed++
			firstBody = res.body
		case res.status == http.StatusCreated && res.replayed == "true":
			replayed++
		case res.status == http.StatusConflict:
			require.NotEmpty(t, res.retryAfter)
			inProgress++
		default:
			t.Fatalf("unexpected response %d: %s", res.status, res.body)
		}
	}
	require.Equal(t, 1, executed)
	require.Equal(t, callers, executed+replayed+inProgress)
	require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 1, "responded": 1}, b.counts.Get())
	require.Equal(t, 1, b.countRows(t, "rides"))
	require.Equal(t, 1, b.provider.Charges())
	require.Equal(t, firstBody, string(b.keyRow(t, "storm").ResponseBody))
}

// Retry-After is the time left on the holder's lease, in whole seconds
// rounded up, at least one, on the runner's clock, capped by the runner's
// MaxRetryAfter (here raised above the lease to show the lease alone).
func TestRetryAfterFollowsTheLease(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	// The walk ends half a second before the lease does, and nothing renews
	// it (heartbeats run on real time, phase commits renew nothing): with
	// the default margin, the released worker would rightly stop short of
	// its foreign call.
	b.runner = b.newRunner(t, &idem.Config{MaxRetryAfter: 2 * time.Minute, LeaseMargin: time.Millisecond})
	h := b.handler(t, nil)
	// Held in its second phase, with its lease.
	entered, release := b.blockPhase(t, "charge_created")
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- post(h, "k-1", rideBody) }()
	<-entered

	for _, step := range []struct {
		advance time.Duration
		want    string
	}{
		{0, "90"},
		{30 * time.Second, "60"},
		{29*time.Second + 500*time.Millisecond, "31"}, // 30.5 s left
		{30 * time.Second, "1"},                       // 0.5 s left
	} {
		b.clock.Advance(step.advance)
		res := post(h, "k-1", rideBody)
		require.Equal(t, http.StatusConflict, res.Code, res.Body.String())
		require.Equal(t, step.want, res.Header().Get("Retry-After"))
	}
	release()
	require.Equal(t, http.StatusCreated, (<-first).Code)
}

// By default a live holder's lease is not waited out: Retry-After is capped
// at the runner's MaxRetryAfter, 2 s.
func TestRetryAfterIsCappedByDefault(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	h := b.handler(t, nil)
	// Held in its second phase, with its lease (see
	// TestRetryAfterFollowsTheLease).
	entered, release := b.blockPhase(t, "charge_created")
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- post(h, "k-1", rideBody) }()
	<-entered
	res := post(h, "k-1", rideBody)
	require.Equal(t, http.StatusConflict, res.Code, res.Body.String())
	require.Equal(t, "2", res.Header().Get("Retry-After"))
	release()
	require.Equal(t, http.StatusCreated, (<-first).Code)
}

// A new key commits, leased, before its first phase runs: a duplicate
// during that phase is told 409 at once, with Retry-After from the lease,
// and another body under the key is 422 then as at every moment.
func TestDuplicateDuringTheFirstPhase(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	b.runner = b.newRunner(t, &idem.Config{MaxRetryAfter: 2 * time.Minute})
	h := b.handler(t, nil)
	entered, release := b.blockPhase(t, "ride_created")
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- post(h, "k-1", rideBody) }()
	<-entered
	res := post(h, "k-1", rideBody)
	require.Equal(t, http.StatusConflict, res.Code, res.Body.String())
	require.Equal(t, idemhttp.ProblemTypeBaseDefault+idemhttp.ProblemInProgress, decodeProblem(t, res).Type)
	require.Equal(t, "90", res.Header().Get("Retry-After"), "the lease's time left")
	require.NotNil(t, b.keyRow(t, "k-1"), "the key committed before its first phase")
	res = post(h, "k-1", `{"origin": "LAX", "amount": 20}`)
	require.Equal(t, http.StatusUnprocessableEntity, res.Code, res.Body.String())
	require.Equal(t, idemhttp.ProblemTypeBaseDefault+idemhttp.ProblemKeyReused, decodeProblem(t, res).Type)
	release()
	require.Equal(t, http.StatusCreated, (<-first).Code)
	require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 1, "responded": 1}, b.counts.Get())
}

// Only Content-Type and Config.ReplayHeaders reach the client, on the first
// response as on replays; New refuses to replay what belongs to one
// exchange.
func TestReplayHeaderAllowlist(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	h := b.handler(t, func(c *idemhttp.Config[rideInput]) { c.ReplayHeaders = []string{"location", "X-Ride", "Location"} })

	first := post(h, "k-1", rideBody)
	replay := post(h, "k-1", rideBody)
	for _, res := range []*httptest.ResponseRecorder{first, replay} {
		require.Equal(t, http.StatusCreated, res.Code)
		require.Equal(t, []string{"application/json"}, res.Header().Values("Content-Type"))
		require.Equal(t, []string{"/rides/1"}, res.Header().Values("Location"))
		require.Equal(t, []string{"1"}, res.Header().Values("X-Ride"))
		for _, never := range []string{"Set-Cookie", "Authorization", "Connection", "Cache-Control"} {
			require.NotContains(t, res.Header(), never)
		}
	}
	require.Equal(t, "true", replay.Header().Get("Idempotent-Replayed"))
	require.NotContains(t, first.Header(), "Idempotent-Replayed")

	stored := b.keyRow(t, "k-1").ResponseHeaders
	require.NotContains(t, stored, "Set-Cookie", "the runner never stores credentials either")
	require.NotContains(t, stored, "Authorization")

	for _, name := range []string{"Set-Cookie", "authorization", "Connection", "Transfer-Encoding", "Content-Length", "Idempotent-Replayed", "bad header", ""} {
		_, err := idemhttp.New(b.runner, b.flow, &idemhttp.Config[rideInput]{Scope: bearerScope, ReplayHeaders: []string{name}})
		require.Error(t, err, "%q", name)
		require.ErrorContains(t, err, "ReplayHeaders")
	}
}

func TestNewRefusesInvalidConfig(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)

	_, err := idemhttp.New(b.runner, b.flow, nil)
	require.ErrorContains(t, err, "Config.Scope is required")
	_, err = idemhttp.New(b.runner, b.flow, &idemhttp.Config[rideInput]{})
	require.ErrorContains(t, err, "Config.Scope is required")
	_, err = idemhttp.New(nil, b.flow, b.config())
	require.ErrorContains(t, err, "needs a runner")
	_, err = idemhttp.New[rideInput](b.runner, nil, b.config())
	require.ErrorContains(t, err, "needs a flow")

	for name, adjust := range map[string]func(*idemhttp.Config[rideInput]){
		"unknown Profile":             func(c *idemhttp.Config[rideInput]) { c.Profile = 7 },
		"MaxBodyBytes -1 is negative": func(c *idemhttp.Config[rideInput]) { c.MaxBodyBytes = -1 },
		"MinKeyLength 256":            func(c *idemhttp.Config[rideInput]) { c.MinKeyLength = 256 },
		"MinKeyLength -1":             func(c *idemhttp.Config[rideInput]) { c.MinKeyLength = -1 },
		"UnavailableRetryAfter":       func(c *idemhttp.Config[rideInput]) { c.UnavailableRetryAfter = -time.Second },
		"ReconcileRetryAfter":         func(c *idemhttp.Config[rideInput]) { c.ReconcileRetryAfter = -time.Second },
		"AuthChallenge":               func(c *idemhttp.Config[rideInput]) { c.AuthChallenge = "Bearer\r\nX-Evil: 1" },
		"ProblemTypeBase":             func(c *idemhttp.Config[rideInput]) { c.ProblemTypeBase = "http://[::1" },
	} {
		cfg := b.config()
		adjust(cfg)
		_, err := idemhttp.New(b.runner, b.flow, cfg)
		require.ErrorContains(t, err, name)
	}

	// The caller's Config is copied: changing it later changes nothing.
	cfg := b.config()
	h, err := idemhttp.New(b.runner, b.flow, cfg)
	require.NoError(t, err)
	cfg.MaxBodyBytes = 1
	require.Equal(t, http.StatusCreated, post(h, "k-1", rideBody).Code)
}

func TestProblemTypeBase(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	h := b.handler(t, func(c *idemhttp.Config[rideInput]) { c.ProblemTypeBase = "https://api.example.com/problems/" })
	require.Equal(t, "https://api.example.com/problems/idempotency-key-missing", h.ProblemType(idemhttp.ProblemKeyMissing))

	p := decodeProblem(t, post(h, "", rideBody))
	require.Equal(t, "https://api.example.com/problems/idempotency-key-missing", p.Type)
}

// A simulated crash (a test hook returning idemtest.ErrSimulatedCrash) drops the
// connection, as a dead server would; the retry after the lease takes over.
func TestSimulatedCrashDropsTheConnection(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	crashing := b.newRunner(t, &idem.Config{Test: idemtest.WithHook(idem.TestConfig{}, func(_ context.Context, at idemtest.HookPoint) error {
		if at.Where == idemtest.HookAfterForeign {
			return idemtest.ErrSimulatedCrash
		}
		return nil
	})})
	srv := httptest.NewServer(b.handlerOn(t, crashing, b.flow, nil))
	t.Cleanup(srv.Close)
	send := func(url string) (*http.Response, error) {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(rideBody))
		require.NoError(t, err)
		req.Header.Set("Authorization", testAuth)
		req.Header.Set("Idempotency-Key", "k-1")
		return srv.Client().Do(req)
	}
	res, err := send(srv.URL)
	if err == nil {
		res.Body.Close()
	}
	require.Error(t, err, "the client sees the connection drop")
	require.NotNil(t, b.keyRow(t, "k-1").LockedAt, "a crash releases nothing")

	healthy := httptest.NewServer(b.handler(t, nil))
	t.Cleanup(healthy.Close)
	b.clock.Advance(91 * time.Second)
	res, err = send(healthy.URL)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusCreated, res.StatusCode)
	require.Equal(t, 1, b.provider.Charges(), "the downstream key made the provider deduplicate")
	require.Equal(t, 1, b.countRows(t, "rides"))
}

// The handler is a plain http.Handler: ServeMux routes by method and path,
// and the middleware shares a path with the resource's other methods.
func TestServeMuxWiring(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	h := b.handler(t, nil)
	list := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"rides": []}`)
	})
	mux := http.NewServeMux()
	mux.Handle("/rides", h.Middleware(list))
	mux.Handle("POST /quotes", b.handlerOn(t, b.runner, b.quote, nil))

	res := serve(mux, httptest.NewRequest(http.MethodGet, "/rides", nil))
	require.Equal(t, http.StatusOK, res.Code)
	require.JSONEq(t, `{"rides": []}`, res.Body.String())

	res = post(mux, "k-1", rideBody)
	require.Equal(t, http.StatusCreated, res.Code)

	r := request("k-2", rideBody)
	r.URL.Path = "/quotes"
	res = serve(mux, r)
	require.Equal(t, http.StatusOK, res.Code)
	require.Equal(t, "quotes", strings.Trim(b.keyRow(t, "k-2").Path, "/"))

	// ServeMux answers other methods on a method pattern itself, PATCH
	// included, in plain text: the handler never sees them.
	for _, method := range []string{http.MethodGet, http.MethodPatch} {
		res = serve(mux, requestTo(method, "/quotes", "k-3", rideBody))
		require.Equal(t, http.StatusMethodNotAllowed, res.Code)
		require.Equal(t, "text/plain; charset=utf-8", res.Header().Get("Content-Type"))
	}
}

// docs/http.md's ServeMux wiring: the handler mounted for each method it
// runs, and MethodNotAllowed for the route's other methods.
func TestServeMuxWiringForPOSTAndPATCH(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	rides := b.handler(t, nil)
	mux := http.NewServeMux()
	mux.Handle("POST /rides", rides)
	mux.Handle("PATCH /rides", rides)
	mux.Handle("/rides", rides.MethodNotAllowed(http.MethodPost, http.MethodPatch))

	res := serve(mux, requestTo(http.MethodPatch, "/rides", "k-1", rideBody))
	require.Equal(t, http.StatusCreated, res.Code, res.Body.String())
	require.Equal(t, "PATCH", b.keyRow(t, "k-1").Method)
	res = serve(mux, requestTo(http.MethodPost, "/rides", "k-2", rideBody))
	require.Equal(t, http.StatusCreated, res.Code, res.Body.String())

	res = serve(mux, requestTo(http.MethodGet, "/rides", "", ""))
	require.Equal(t, http.StatusMethodNotAllowed, res.Code)
	require.Equal(t, "POST, PATCH", res.Header().Get("Allow"))
	p := decodeProblem(t, res)
	require.Equal(t, rides.ProblemType(idemhttp.ProblemMethodNotAllowed), p.Type)
	require.Equal(t, "GET is not supported here: use POST or PATCH.", p.Detail)
}

// The flow keeps running when the client goes away, so its retry replays
// instead of resuming a half-done request; the request's context values
// still reach the phases.
func TestFlowSurvivesClientDisconnect(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	h := b.handler(t, nil)
	type ctxKey struct{}
	entered, release := b.blockPhase(t, "charge_created")
	var seen any
	b.setHook("responded", func(ctx context.Context, _ idem.Tx, _ *idem.Attempt[rideInput]) error {
		seen = ctx.Value(ctxKey{})
		return ctx.Err()
	})

	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "trace-1"))
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- serve(h, request("k-1", rideBody).WithContext(ctx)) }()
	<-entered
	cancel()
	release()
	res := <-done
	require.Equal(t, http.StatusCreated, res.Code, res.Body.String())
	require.Equal(t, "trace-1", seen)
	b.requireFinished(t, "k-1", res)
}

func TestWriteProblem(t *testing.T) {
	t.Parallel()
	p := &idemhttp.Problem{
		Type:   "https://api.example.com/problems/out-of-cars",
		Title:  "No cars available",
		Status: http.StatusServiceUnavailable,
		Detail: "Every car near SFO is busy.",
		Errors: []idemhttp.FieldError{{Field: "origin", Detail: "has no cars"}},
		Header: http.Header{"Retry-After": {"30"}},
	}
	require.Equal(t, "idemhttp: 503 No cars available: Every car near SFO is busy.", p.Error())
	var asErr error = p
	var target *idemhttp.Problem
	require.True(t, errors.As(asErr, &target))

	res := httptest.NewRecorder()
	idemhttp.WriteProblem(res, idemhttp.ProfileIETF, p)
	require.Equal(t, http.StatusServiceUnavailable, res.Code)
	require.Equal(t, "30", res.Header().Get("Retry-After"))
	require.Equal(t, "application/problem+json", res.Header().Get("Content-Type"))
	require.JSONEq(t, `{"type": "https://api.example.com/problems/out-of-cars", "title": "No cars available", "status": 503,
		"detail": "Every car near SFO is busy.", "errors": [{"field": "origin", "detail": "has no cars"}]}`, res.Body.String())

	res = httptest.NewRecorder()
	idemhttp.WriteProblem(res, idemhttp.ProfileStripe, p)
	require.JSONEq(t, `{"type": "https://api.example.com/problems/out-of-cars", "title": "No cars available", "status": 503,
		"detail": "Every car near SFO is busy.", "errors": [{"field": "origin", "detail": "has no cars"}],
		"error": {"type": "api_error", "message": "Every car near SFO is busy.", "param": "origin"}}`, res.Body.String())

	// The zero Problem is a valid 500 about:blank.
	res = httptest.NewRecorder()
	idemhttp.WriteProblem(res, idemhttp.ProfileIETF, &idemhttp.Problem{})
	require.Equal(t, http.StatusInternalServerError, res.Code)
	var body map[string]any
	require.NoError(t, json.Unmarshal(res.Body.Bytes(), &body))
	require.Equal(t, map[string]any{"type": "about:blank", "title": "Internal Server Error", "status": float64(500)}, body)
}

func TestProfileString(t *testing.T) {
	t.Parallel()
	require.Equal(t, "ietf", idemhttp.ProfileIETF.String())
	require.Equal(t, "stripe", idemhttp.ProfileStripe.String())
	require.Equal(t, "Profile(9)", idemhttp.Profile(9).String())
}

// Configured Retry-After durations are sent as whole seconds, rounded up,
// and never as zero.
func TestConfiguredRetryAfterRoundsUp(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	for _, tt := range []struct {
		after time.Duration
		want  string
	}{
		{2500 * time.Millisecond, "3"},
		{time.Millisecond, "1"},
		{2 * time.Minute, "120"},
	} {
		h, err := idemhttp.New(b.runner, b.sms, &idemhttp.Config[smsInput]{Scope: bearerScope, ReconcileRetryAfter: tt.after})
		require.NoError(t, err)
		res := post(h, "k-1", `{"to": "+15550100"}`)
		require.Equal(t, http.StatusServiceUnavailable, res.Code)
		require.Equal(t, tt.want, res.Header().Get("Retry-After"))
	}
}

// A client that goes away while its request waits (Prefer: wait) ends the
// wait: the handler returns at once instead of keeping the request, its
// body and its goroutine for MaxWait. The request in flight is untouched.
func TestWaitEndsWhenTheClientGoesAway(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	b.runner = b.newRunner(t, &idem.Config{Test: idem.TestConfig{Now: time.Now}})
	h := b.handler(t, func(c *idemhttp.Config[rideInput]) { c.MaxWait = time.Hour })
	// Held in its second phase: until its first phase commits, a new key
	// has no lease row for the waiter to watch.
	entered, release := b.blockPhase(t, "charge_created")
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- post(h, "k-1", rideBody) }()
	<-entered

	ctx, cancel := context.WithCancel(context.Background())
	r := request("k-1", rideBody).WithContext(ctx)
	r.Header.Set("Prefer", "wait=3600")
	waiter := make(chan *httptest.ResponseRecorder, 1)
	began := time.Now()
	go func() { waiter <- serve(h, r) }()
	// The waiter has found the key in flight once its watch marked it.
	require.Eventually(t, func() bool {
		var marked bool
		err := b.pool.QueryRow(context.Background(), `SELECT waited_at IS NOT NULL FROM idem_leases`).Scan(&marked)
		return err == nil && marked
	}, time.Minute, 5*time.Millisecond)
	cancel()
	res := <-waiter
	require.Equal(t, http.StatusConflict, res.Code, "no one reads it; the handler has returned")
	require.Less(t, time.Since(began), 30*time.Second, "not the hour it asked for")
	release()
	require.Equal(t, http.StatusCreated, (<-first).Code, "the request in flight goes on")
}
