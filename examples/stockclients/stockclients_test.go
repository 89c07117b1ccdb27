package stockclients_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v82"
	"github.com/stripe/stripe-go/v82/webhook"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/examples/stockclients"
	"github.com/go-idem/idem/idemhttp"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/internal/testfixture"
	"github.com/go-idem/idem/pgstore"
)

// serveEnv makes the test binary run the charges server (serve), so the
// tests can kill it with SIGKILL as a real process.
const serveEnv = "STOCKCLIENTS_SERVE"

const webhookSecret = "whsec_stockclients_0123456789"

func TestMain(m *testing.M) {
	if addr := os.Getenv(serveEnv); addr != "" {
		if err := serve(addr, os.Getenv("STOCKCLIENTS_DB"), os.Getenv("STOCKCLIENTS_SCHEMA"), os.Getenv("STOCKCLIENTS_CARD"),
			os.Getenv("STOCKCLIENTS_DETACHED")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	pgtest.Main(m)
}

// serve is the server process, wired as README's quick start says: a
// store with an Instance (a restarted process takes its own keys over at
// once), a runner that knows both flows, a Maintainer (the completer
// finishes what clients abandon) stopped before the store closes, and an
// http.Server with timeouts. detached, when set, is the limit of the
// process's runs without a client (idemhttp.DetachedRuns).
func serve(addr, databaseURL, schema, cardURL, detached string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := pgstore.New(pool, &pgstore.Config{Schema: schema, Instance: "charges-1"})
	if err != nil {
		return err
	}
	defer store.Close()
	card := &stockclients.CardNetwork{URL: cardURL, Client: &http.Client{Timeout: 5 * time.Second}}
	charges := stockclients.Flow(card)
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	runner, err := idem.NewRunner(store, &idem.Config{Flows: []idem.AnyFlow{charges, stockclients.EventFlow}, Logger: logger})
	if err != nil {
		return err
	}
	maintainer, err := idem.NewMaintainer(runner, &idem.MaintainerConfig{
		CompleteInterval: 500 * time.Millisecond, Complete: idem.CompleteConfig{IdleFor: time.Second},
	})
	if err != nil {
		return err
	}
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = maintainer.Serve(mctx) }()
	// Shutdown order: stop the Maintainer and wait for it, then the store.
	defer func() { cancel(); <-done }()

	var bound *idemhttp.DetachedRuns
	if detached != "" {
		limit, err := strconv.Atoi(detached)
		if err != nil {
			return err
		}
		bound = idemhttp.NewDetachedRuns(limit)
	}
	mux, err := stockclients.Mux(runner, charges, []string{webhookSecret}, bound)
	if err != nil {
		return err
	}
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, MaxHeaderBytes: 64 << 10}
	go func() { <-ctx.Done(); _ = srv.Shutdown(context.Background()) }()
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// cardNetwork is the fake card network: it deduplicates on the
// Idempotency-Key (the downstream key), keeps a ledger, fails 3% of calls
// before doing anything and drops the answer of 3% after charging. With
// a gate, its first holdFirst calls wait, before anything, until the gate
// opens or their caller goes away.
type cardNetwork struct {
	mu              sync.Mutex
	byKey           map[string]string              // downstream key -> card charge id
	byOrder         map[string]map[string]struct{} // order -> card charge ids
	failed, dropped atomic.Int64

	gate        chan struct{}
	holdFirst   int64
	calls, held atomic.Int64
}

func (c *cardNetwork) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if c.gate != nil && c.calls.Add(1) <= c.holdFirst {
		c.held.Add(1)
		select {
		case <-c.gate:
		case <-r.Context().Done():
			return
		}
	}
	var in struct {
		OrderID string `json:"order_id"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	roll := mrand.IntN(100)
	if roll < 3 {
		c.failed.Add(1)
		http.Error(w, "try again", http.StatusServiceUnavailable)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	c.mu.Lock()
	id, ok := c.byKey[key]
	if !ok {
		id = fmt.Sprintf("cc_%d", len(c.byKey)+1)
		c.byKey[key] = id
		if c.byOrder[in.OrderID] == nil {
			c.byOrder[in.OrderID] = map[string]struct{}{}
		}
		c.byOrder[in.OrderID][id] = struct{}{}
	}
	c.mu.Unlock()
	if roll < 6 {
		c.dropped.Add(1)
		panic(http.ErrAbortHandler) // charged, answer lost
	}
	_ = json.NewEncoder(w).Encode(map[string]string{"id": id})
}

func (c *cardNetwork) charges(order string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byOrder[order])
}

// dropProxy forwards each request to the server and drops 10% of the
// answers after the server has handled the request; a request it cannot
// forward (the server is dead) loses its connection too.
type dropProxy struct {
	target    string
	transport *http.Transport
	dropped   atomic.Int64
}

func (p *dropProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, p.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	out.Header = r.Header.Clone()
	res, err := p.roundTrip(out, body)
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	defer res.Body.Close()
	answer, err := io.ReadAll(res.Body)
	if err != nil || mrand.IntN(100) < 10 {
		p.dropped.Add(1)
		panic(http.ErrAbortHandler)
	}
	for k, v := range res.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(res.StatusCode)
	_, _ = w.Write(answer)
}

// roundTrip forwards out, and while the server refuses connections (killed,
// its replacement starting) connects again, as a load balancer in front of
// a restarting instance does, for up to a minute: a refused connection
// delivered nothing, so nothing is sent twice. How long a restart takes on
// a loaded machine is then no part of what the clients see, but the
// answers lost with the killed process are.
func (p *dropProxy) roundTrip(out *http.Request, body []byte) (*http.Response, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		res, err := p.transport.RoundTrip(out)
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) || time.Now().After(deadline) {
			return res, err
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-out.Context().Done():
			t.Stop()
			return nil, out.Context().Err()
		case <-t.C:
		}
		out = out.Clone(out.Context())
		out.Body = io.NopCloser(bytes.NewReader(body))
	}
}

// env is a server process behind the drop proxy, with its card network.
type env struct {
	opts    serverOptions
	schema  *pgtest.Schema
	card    *cardNetwork
	proxy   *dropProxy
	url     string // the proxy's
	addr    string // the server's
	cardURL string
	mu      sync.Mutex
	cmd     *exec.Cmd
	output  *testfixture.Buffer
	kills   int

	gateOnce sync.Once
}

// serverOptions are what a test changes of the server process and its
// card network.
type serverOptions struct {
	detached  int   // the process's idemhttp.DetachedRuns limit; 0: the default
	poolConns int   // pgxpool's pool_max_conns; 0: pgxpool's default
	holdFirst int64 // the card network holds its first holdFirst calls until the gate opens (openGate)
}

func setup(t *testing.T) *env {
	t.Helper()
	return setupWith(t, serverOptions{})
}

func setupWith(t *testing.T, opts serverOptions) *env {
	t.Helper()
	schema := pgtest.NewMigratedSchema(t)
	require.NoError(t, stockclients.Migrate(context.Background(), schema.Pool))
	e := &env{opts: opts, schema: schema, card: &cardNetwork{byKey: map[string]string{}, byOrder: map[string]map[string]struct{}{}},
		output: &testfixture.Buffer{}}
	if opts.holdFirst > 0 {
		e.card.gate, e.card.holdFirst = make(chan struct{}), opts.holdFirst
		t.Cleanup(e.openGate)
	}
	cardSrv := httptest.NewServer(e.card)
	t.Cleanup(cardSrv.Close)
	e.cardURL = cardSrv.URL
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	e.addr = l.Addr().String()
	require.NoError(t, l.Close())
	e.proxy = &dropProxy{target: "http://" + e.addr, transport: &http.Transport{DisableKeepAlives: true}}
	proxySrv := httptest.NewServer(e.proxy)
	t.Cleanup(proxySrv.Close)
	e.url = proxySrv.URL
	e.start(t)
	t.Cleanup(func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		_ = e.cmd.Process.Signal(syscall.SIGTERM)
		_ = e.cmd.Wait()
		if t.Failed() {
			t.Logf("server output:\n%s", e.output.String())
		}
	})
	return e
}

// start runs the server process and waits until it accepts connections.
func (e *env) start(t *testing.T) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	dbURL := e.schema.URL
	if e.opts.poolConns > 0 {
		sep := "?"
		if strings.Contains(dbURL, "?") {
			sep = "&"
		}
		dbURL += sep + "pool_max_conns=" + strconv.Itoa(e.opts.poolConns)
	}
	cmd.Env = append(os.Environ(), serveEnv+"="+e.addr, "STOCKCLIENTS_DB="+dbURL,
		"STOCKCLIENTS_SCHEMA="+e.schema.Name, "STOCKCLIENTS_CARD="+e.cardURL)
	if e.opts.detached > 0 {
		cmd.Env = append(cmd.Env, "STOCKCLIENTS_DETACHED="+strconv.Itoa(e.opts.detached))
	}
	cmd.Stdout, cmd.Stderr = e.output, e.output
	require.NoError(t, cmd.Start())
	e.cmd = cmd
	require.Eventually(t, func() bool {
		c, err := net.DialTimeout("tcp", e.addr, time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	}, time.Minute, 20*time.Millisecond, "the server listens")
}

// restart kills the server with SIGKILL, as a crash would, and starts it
// again under the same Instance.
func (e *env) restart(t *testing.T) {
	e.mu.Lock()
	defer e.mu.Unlock()
	require.NoError(t, e.cmd.Process.Signal(syscall.SIGKILL))
	_ = e.cmd.Wait()
	e.kills++
	e.start(t)
}

// settle waits until no key is unfinished: the completer finished every
// request its client abandoned.
func (e *env) settle(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := e.schema.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idem_keys WHERE status <> 'finished'`).Scan(&n)
		return err == nil && n == 0
	}, 2*time.Minute, 100*time.Millisecond, "the completer finishes every abandoned key")
}

// run makes n charges, concurrency at a time, killing the server twice on
// the way; charge makes one and reports whether the client was told it
// succeeded.
func (e *env) run(t *testing.T, n, concurrency int, charge func(order string, amount int64) bool) (ok []bool) {
	ok = make([]bool, n)
	var next, finished atomic.Int64
	var wg sync.WaitGroup
	for range concurrency {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				ok[i] = charge(fmt.Sprintf("order-%d", i), int64(1000+i))
				if f := finished.Add(1); f == int64(n/3) || f == int64(2*n/3) {
					e.restart(t)
				}
			}
		})
	}
	wg.Wait()
	return ok
}

// tally counts, once the completer has run, the orders charged twice and
// those the client was told failed that were charged nevertheless.
func (e *env) tally(t *testing.T, ok []bool) (twice, failedCharged, failed int) {
	e.settle(t)
	for i, good := range ok {
		n := e.card.charges(fmt.Sprintf("order-%d", i))
		if n > 1 {
			twice++
		}
		if !good {
			failed++
			if n > 0 {
				failedCharged++
			}
		}
		if good {
			require.Equal(t, 1, n, "order-%d was reported charged", i)
		}
	}
	return twice, failedCharged, failed
}

// stripe-go at its default settings (2 network retries, its own backoff
// and timeout), with an application retry that takes the key from the
// failed call's response, as Stripe's docs advise: 0 charged twice, and at
// most 3 calls reported failed that were charged nevertheless.
func TestStripeGoDefaults(t *testing.T) {
	t.Parallel()
	e := setup(t)
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:           stripe.String(e.url),
		LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	sc := stripe.NewClient("sk_test_alice", stripe.WithBackends(&stripe.Backends{API: backend}))
	const n, concurrency = 300, 8
	began := time.Now()
	ok := e.run(t, n, concurrency, func(order string, amount int64) bool {
		params := &stripe.ChargeCreateParams{Amount: stripe.Int64(amount), Currency: stripe.String("usd")}
		params.AddMetadata("order_id", order)
		for attempt := 1; ; attempt++ {
			_, err := sc.V1Charges.Create(context.Background(), params)
			if err == nil {
				return true
			}
			var se *stripe.Error
			if !errors.As(err, &se) || se.LastResponse == nil || se.LastResponse.IdempotencyKey == "" ||
				se.HTTPStatusCode < 409 || attempt == 5 {
				log.Printf("charge %s failed after %d tries: %v", order, attempt, err)
				return false
			}
			// The application's retry: the same key, from the response.
			params.SetIdempotencyKey(se.LastResponse.IdempotencyKey)
			time.Sleep(500 * time.Millisecond)
		}
	})
	elapsed := time.Since(began)
	twice, failedCharged, failed := e.tally(t, ok)
	t.Logf("stripe-go v82.5.1 defaults, %d charges at concurrency %d in %s: %d succeeded, %d reported failed (%d of them charged), "+
		"%d charged twice; %d server kills (SIGKILL), %d answers dropped by the proxy, card network %d failed, %d answers lost",
		n, concurrency, elapsed.Round(time.Millisecond), n-failed, failed, failedCharged, twice, e.kills,
		e.proxy.dropped.Load(), e.card.failed.Load(), e.card.dropped.Load())
	require.Zero(t, twice, "no order is charged twice")
	require.LessOrEqual(t, failedCharged, 3, "calls reported failed yet charged")
}

// go-retryablehttp with its default policy (4 retries of connection
// errors, 429 and 5xx, exponential backoff from 1 s): every charge
// succeeds, none twice.
func TestRetryableHTTPDefaults(t *testing.T) {
	t.Parallel()
	e := setup(t)
	client := retryablehttp.NewClient()
	client.Logger = nil
	const n, concurrency = 300, 8
	began := time.Now()
	ok := e.run(t, n, concurrency, func(order string, amount int64) bool {
		body, _ := json.Marshal(stockclients.ChargeParams{Amount: amount, Currency: "usd", Metadata: map[string]string{"order_id": order}})
		req, err := retryablehttp.NewRequest(http.MethodPost, e.url+"/v1/charges", body)
		if err != nil {
			return false
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer sk_test_bob")
		req.Header.Set("Idempotency-Key", rand.Text()) // one key per charge, kept across the client's retries
		res, err := client.Do(req)
		if err != nil {
			return false
		}
		defer res.Body.Close()
		_, _ = io.Copy(io.Discard, res.Body)
		return res.StatusCode == http.StatusOK
	})
	elapsed := time.Since(began)
	twice, failedCharged, failed := e.tally(t, ok)
	t.Logf("go-retryablehttp v0.7.8 default policy, %d charges at concurrency %d in %s: %d succeeded, %d failed (%d of them charged), "+
		"%d charged twice; %d server kills (SIGKILL), %d answers dropped by the proxy, card network %d failed, %d answers lost",
		n, concurrency, elapsed.Round(time.Millisecond), n-failed, failed, failedCharged, twice, e.kills,
		e.proxy.dropped.Load(), e.card.failed.Load(), e.card.dropped.Load())
	require.Zero(t, twice)
	require.Zero(t, failed, "every charge succeeds")
}

// Webhooks signed by stripe-go's own helper are booked once, however often
// and however concurrently they are delivered; a receiver whose secrets
// hold an empty one is refused when it is built.
func TestStripeSignedWebhooks(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const events = 20
	var wg sync.WaitGroup
	var accepted atomic.Int64
	for i := range events {
		payload := fmt.Appendf(nil, `{"id":"evt_%d","object":"event","type":"charge.succeeded"}`, i)
		for range 3 { // a delivery and two redeliveries, at once
			wg.Go(func() {
				signed := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: payload, Secret: webhookSecret})
				for {
					req, err := http.NewRequest(http.MethodPost, "http://"+e.addr+"/webhooks/stripe", bytes.NewReader(payload))
					require.NoError(t, err)
					req.Header.Set("Stripe-Signature", signed.Header)
					res, err := http.DefaultClient.Do(req)
					require.NoError(t, err)
					_ = res.Body.Close()
					if res.StatusCode == http.StatusOK {
						accepted.Add(1)
						return
					}
					require.Equal(t, http.StatusServiceUnavailable, res.StatusCode, "only a delivery in progress is refused")
				}
			})
		}
	}
	wg.Wait()
	forged := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: []byte(`{"id":"evt_x","type":"t"}`), Secret: "whsec_not_the_secret_at_all"})
	req, err := http.NewRequest(http.MethodPost, "http://"+e.addr+"/webhooks/stripe", bytes.NewReader(forged.Payload))
	require.NoError(t, err)
	req.Header.Set("Stripe-Signature", forged.Header)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Equal(t, http.StatusBadRequest, res.StatusCode)

	var booked int
	require.NoError(t, e.schema.Pool.QueryRow(context.Background(), `SELECT count(*) FROM events`).Scan(&booked))
	require.Equal(t, events, booked, "each event booked once")
	_, err = idemhttp.StripeSignature([]string{webhookSecret, ""}, 0)
	require.Error(t, err, "an empty secret is refused when the verifier is built")
	t.Logf("webhooks: %d stripe-go-signed events delivered 3 times each at once: %d deliveries answered 200, %d events booked; forged delivery 400; empty secret refused at build: %v",
		events, accepted.Load(), booked, err)
}

// openGate lets the card network's held calls, and every later one, through.
func (e *env) openGate() {
	e.gateOnce.Do(func() { close(e.card.gate) })
}
