package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemhttp"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/internal/testfixture"
)

// runMainEnv makes the test binary behave as the webhooks program, so the
// tests can run serve as real processes.
const runMainEnv = "WEBHOOKS_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	pgtest.Main(m)
}

const testSecret = "whsec_test_0123456789"

// server is a serve process.
type server struct {
	name   string
	url    string
	cmd    *exec.Cmd
	output *testfixture.Buffer
	exited chan error
	killed bool
}

// startServer runs serve on databaseURL at a free local address, with
// args added, and waits until it answers /healthz. The address is free
// when picked but may be taken before the process binds it (other tests
// run at the same time): a start that fails to bind is tried again. The
// process is stopped with SIGTERM when the test ends and must then exit 0,
// unless the test killed it.
func startServer(t *testing.T, ctx context.Context, name, databaseURL string, args ...string) *server {
	t.Helper()
	for try := 1; ; try++ {
		if s := tryStart(t, ctx, name, databaseURL, args); s != nil {
			return s
		}
		require.Less(t, try, 5, "%s found its address taken %d times", name, try)
	}
}

func tryStart(t *testing.T, ctx context.Context, name, databaseURL string, args []string) *server {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())

	cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"serve", "--addr", addr}, args...)...)
	for _, kv := range os.Environ() {
		switch n, _, _ := strings.Cut(kv, "="); n {
		case "DATABASE_URL", "WEBHOOK_SECRET", "WEBHOOKS_ADDR", runMainEnv:
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	cmd.Env = append(cmd.Env, runMainEnv+"=1", "DATABASE_URL="+databaseURL, "WEBHOOK_SECRET="+testSecret)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	s := &server{name: name, url: "http://" + addr, cmd: cmd, output: &testfixture.Buffer{}, exited: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = s.output, s.output
	require.NoError(t, cmd.Start())
	go func() { s.exited <- cmd.Wait() }()

	deadline := time.Now().Add(2 * time.Minute)
	for {
		select {
		case err := <-s.exited:
			if strings.Contains(s.output.String(), "address already in use") {
				return nil
			}
			t.Fatalf("%s exited before it was ready (%v):\n%s", name, err, s.output.String())
		default:
		}
		if resp, err := http.Get(s.url + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		require.True(t, time.Now().Before(deadline), "%s was not ready within two minutes:\n%s", name, s.output.String())
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v", name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Cleanup(func() {
		if s.killed {
			return
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-s.exited:
			require.NoError(t, err, "%s did not exit cleanly on SIGTERM:\n%s", name, s.output.String())
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			t.Errorf("%s did not stop within a minute of SIGTERM:\n%s", name, s.output.String())
		}
	})
	return s
}

// kill kills the process with SIGKILL, as a crash would, and waits for it.
func (s *server) kill(t *testing.T) {
	t.Helper()
	s.killed = true
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGKILL))
	select {
	case <-s.exited:
	case <-time.After(time.Minute):
		t.Fatalf("%s did not die of SIGKILL within a minute", s.name)
	}
}

// waitOutput waits until the process has printed want.
func (s *server) waitOutput(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(s.output.String(), want) {
		require.True(t, time.Now().Before(deadline), "%s never printed %q:\n%s", s.name, want, s.output.String())
		time.Sleep(20 * time.Millisecond) // polling another process's output
	}
}

// stripeEvent is a Stripe-shaped event body, with members the receiver
// does not read, as Stripe sends them.
func stripeEvent(t *testing.T, id, typ, account string, amount int64) []byte {
	t.Helper()
	ev := map[string]any{
		"id": id, "object": "event", "type": typ, "api_version": "2024-06-20", "created": 1767323045, "livemode": false,
		"pending_webhooks": 1, "request": map[string]any{"id": "req_" + id, "idempotency_key": nil},
		"data": map[string]any{"object": map[string]any{"id": "pi_" + id, "object": "payment_intent", "amount": amount, "currency": "eur"}},
	}
	if account != "" {
		ev["account"] = account
	}
	body, err := json.Marshal(ev)
	require.NoError(t, err)
	return body
}

// answer is what a delivery got.
type answer struct {
	status     int
	replayed   bool
	retryAfter string
	problem    string // the problem type's name, for a problem
	body       []byte
	err        error
}

// deliver posts body to a server's receiver with signature (empty: a
// fresh Stripe-Signature made with the test's secret), as the provider
// does.
func deliver(url string, body []byte, signature string) answer {
	if signature == "" {
		signature = Sign(testSecret, time.Now(), body)
	}
	req, err := http.NewRequest(http.MethodPost, url+"/webhooks/stripe", bytes.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	req.Header.Set(SignatureHeader, signature)
	client := &http.Client{Timeout: 2 * time.Minute}
	res, err := client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer res.Body.Close()
	out, err := io.ReadAll(res.Body)
	a := answer{status: res.StatusCode, replayed: res.Header.Get("Idempotent-Replayed") == "true",
		retryAfter: res.Header.Get("Retry-After"), body: out, err: err}
	if res.Header.Get("Content-Type") == "application/problem+json" {
		var p struct{ Type string }
		if json.Unmarshal(out, &p) == nil {
			a.problem = strings.TrimPrefix(p.Type, idemhttp.ProblemTypeBaseDefault)
		}
	}
	return a
}

// deliverUntilDone redelivers body to the servers in turn until one
// answers 2xx, as a provider does, and returns that answer and the
// answers before it.
func deliverUntilDone(t *testing.T, body []byte, urls ...string) (answer, []answer) {
	t.Helper()
	var before []answer
	deadline := time.Now().Add(3 * time.Minute)
	for i := 0; ; i++ {
		a := deliver(urls[i%len(urls)], body, "")
		if a.err == nil && a.status/100 == 2 {
			return a, before
		}
		before = append(before, a)
		require.True(t, time.Now().Before(deadline), "no 2xx within three minutes; last answer %d %s (%v)", a.status, a.body, a.err)
		time.Sleep(100 * time.Millisecond) // the provider's backoff, not a synchronisation
	}
}

// requireOnceEach checks the ledger: exactly one entry for each event of
// account, and each event recorded once.
func requireOnceEach(t *testing.T, schema *pgtest.Schema, account string, ids []string) {
	t.Helper()
	ctx := context.Background()
	for _, id := range ids {
		var entries, events int
		require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT count(*) FROM ledger WHERE event_id = $1 AND account = $2`, id, account).Scan(&entries))
		require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_events WHERE event_id = $1 AND account = $2`, id, account).Scan(&events))
		require.Equal(t, 1, entries, "ledger entries of %s (account %q)", id, account)
		require.Equal(t, 1, events, "event rows of %s (account %q)", id, account)
	}
}

func count(t *testing.T, schema *pgtest.Schema, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, schema.Pool.QueryRow(context.Background(), query, args...).Scan(&n))
	return n
}

// Two serve processes on one database receive the same events as a
// provider delivers them: duplicates at once to both, redeliveries after
// the event finished, the same id with another body, bad signatures. Every
// event is booked exactly once.
func TestTwoProcesses(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel) // after the servers' SIGTERM cleanups
	schema := pgtest.NewSchema(t)
	require.NoError(t, Migrate(ctx, schema.Pool, ""))
	a := startServer(t, ctx, "serve A", schema.URL, "--lease", "10s")
	b := startServer(t, ctx, "serve B", schema.URL, "--lease", "10s")
	urls := []string{a.url, b.url}

	const events, copies = 12, 6
	var ids []string
	bodies, first := map[string][]byte{}, map[string][]byte{}

	t.Run("concurrent duplicates to both processes", func(t *testing.T) {
		answers := make(chan struct {
			id string
			a  answer
		}, events*copies)
		var wg sync.WaitGroup
		for e := range events {
			id := fmt.Sprintf("evt_dup_%02d", e)
			ids = append(ids, id)
			body := stripeEvent(t, id, "payment_intent.succeeded", "", int64(100+e))
			bodies[id] = body
			start := make(chan struct{})
			for c := range copies {
				wg.Go(func() {
					<-start
					answers <- struct {
						id string
						a  answer
					}{id, deliver(urls[c%2], body, "")}
				})
			}
			close(start)
		}
		wg.Wait()
		close(answers)
		executed, replayed, busy := map[string]int{}, 0, 0
		for got := range answers {
			require.NoError(t, got.a.err)
			switch {
			case got.a.status == http.StatusOK && !got.a.replayed:
				executed[got.id]++
				first[got.id] = got.a.body
			case got.a.status == http.StatusOK:
				replayed++
			case got.a.status == http.StatusServiceUnavailable && got.a.problem == idemhttp.ProblemWebhookEventInProgress:
				require.NotEmpty(t, got.a.retryAfter)
				busy++
			default:
				t.Fatalf("%s: unexpected answer %d: %s\nserve A:\n%s\nserve B:\n%s", got.id, got.a.status, got.a.body, a.output.String(), b.output.String())
			}
		}
		// Those answered 503 are redelivered, as the provider would.
		for _, id := range ids {
			if executed[id] == 0 {
				deliverUntilDone(t, bodies[id], urls...)
			}
		}
		for _, id := range ids {
			require.LessOrEqual(t, executed[id], 1, "%s executed twice", id)
		}
		requireOnceEach(t, schema, "", ids)
		t.Logf("%d events x %d simultaneous deliveries over 2 processes: %d executed, %d replayed, %d answered 503 in progress; ledger: %d entries",
			events, copies, len(executed), replayed, busy, count(t, schema, `SELECT count(*) FROM ledger`))
	})

	t.Run("redelivery after the event finished", func(t *testing.T) {
		for _, id := range ids {
			for _, url := range urls {
				got := deliver(url, bodies[id], "")
				require.NoError(t, got.err)
				require.Equal(t, http.StatusOK, got.status, "%s", got.body)
				require.True(t, got.replayed)
				if want, ok := first[id]; ok {
					require.Equal(t, want, got.body)
				}
			}
		}
		requireOnceEach(t, schema, "", ids)
	})

	t.Run("redelivery with another pending_webhooks", func(t *testing.T) {
		// Stripe updates pending_webhooks between deliveries of an event:
		// Content leaves it out, so the redelivery is the same event.
		for i, pending := range []int{0, 3, 7} {
			var ev map[string]any
			require.NoError(t, json.Unmarshal(bodies[ids[0]], &ev))
			require.EqualValues(t, 1, ev["pending_webhooks"])
			ev["pending_webhooks"] = pending
			body, err := json.Marshal(ev)
			require.NoError(t, err)
			got := deliver(urls[i%2], body, "")
			require.NoError(t, got.err)
			require.Equal(t, http.StatusOK, got.status, "pending_webhooks %d: %s", pending, got.body)
			require.True(t, got.replayed)
			if want, ok := first[ids[0]]; ok {
				require.Equal(t, want, got.body)
			}
		}
		requireOnceEach(t, schema, "", ids[:1])
	})

	t.Run("the same event id with another body", func(t *testing.T) {
		before := count(t, schema, `SELECT count(*) FROM ledger`)
		got := deliver(b.url, stripeEvent(t, ids[0], "payment_intent.succeeded", "", 999_999), "")
		require.NoError(t, got.err)
		require.Equal(t, http.StatusUnprocessableEntity, got.status, "%s", got.body)
		require.Equal(t, idemhttp.ProblemWebhookEventReused, got.problem)
		b.waitOutput(t, "webhook event delivered again with another body")
		// The line names the event (its key) only with the runner's
		// Config.LogKeys, which this service leaves off.
		require.Equal(t, before, count(t, schema, `SELECT count(*) FROM ledger`))
		requireOnceEach(t, schema, "", ids[:1])
	})

	t.Run("bad signatures store nothing", func(t *testing.T) {
		body := stripeEvent(t, "evt_forged", "payment_intent.succeeded", "", 1_000_000)
		for name, sig := range map[string]string{
			"another secret": Sign("whsec_attacker", time.Now(), body),
			"another body":   Sign(testSecret, time.Now(), stripeEvent(t, "evt_forged", "payment_intent.succeeded", "", 1)),
			"too old":        Sign(testSecret, time.Now().Add(-10*time.Minute), body),
			"no v1":          "t=" + strconv.FormatInt(time.Now().Unix(), 10),
			"garbage v1":     "t=" + strconv.FormatInt(time.Now().Unix(), 10) + ",v1=zz",
		} {
			got := deliver(a.url, body, sig)
			require.NoError(t, got.err)
			require.Equal(t, http.StatusBadRequest, got.status, "%s: %s", name, got.body)
			require.Equal(t, idemhttp.ProblemWebhookSignatureInvalid, got.problem, name)
		}
		require.Zero(t, count(t, schema, `SELECT count(*) FROM idem_keys WHERE key = 'evt_forged'`))
		require.Zero(t, count(t, schema, `SELECT count(*) FROM webhook_events WHERE event_id = 'evt_forged'`))
		require.Zero(t, count(t, schema, `SELECT count(*) FROM ledger WHERE event_id = 'evt_forged'`))
	})

	t.Run("one event id in two accounts is two events", func(t *testing.T) {
		for i, account := range []string{"acct_1", "acct_2"} {
			got := deliver(urls[i], stripeEvent(t, "evt_connect", "charge.refunded", account, 40), "")
			require.NoError(t, got.err)
			require.Equal(t, http.StatusOK, got.status, "%s", got.body)
			require.False(t, got.replayed)
			requireOnceEach(t, schema, account, []string{"evt_connect"})
		}
		require.Equal(t, -80, count(t, schema, `SELECT sum(amount)::int FROM ledger WHERE event_id = 'evt_connect'`))
		require.Equal(t, 2, count(t, schema, `SELECT count(*) FROM idem_keys WHERE key = 'evt_connect' AND scope IN ('webhook:stripe/acct_1', 'webhook:stripe/acct_2')`))
	})
}

// A process killed with SIGKILL in the middle of an event, after its first
// phase committed and before its ledger entry did: the provider's
// redelivery to the other process gets 503 while the dead one's lease
// runs, then resumes the event after its committed phase and books it
// once.
func TestKilledMidEventTheOtherProcessFinishesIt(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	schema := pgtest.NewSchema(t)
	require.NoError(t, Migrate(ctx, schema.Pool, ""))
	a := startServer(t, ctx, "serve A", schema.URL, "--lease", "10s", "--stall-phase", PhaseLedgerBooked)
	b := startServer(t, ctx, "serve B", schema.URL, "--lease", "10s")

	body := stripeEvent(t, "evt_killed", "payment_intent.succeeded", "", 4200)
	dropped := make(chan answer, 1)
	go func() { dropped <- deliver(a.url, body, "") }()
	a.waitOutput(t, "stalled: event evt_killed at the end of "+PhaseLedgerBooked)
	// A holds the event: its first phase committed, its ledger insert is
	// made and not committed.
	require.Equal(t, 1, count(t, schema, `SELECT count(*) FROM webhook_events WHERE event_id = 'evt_killed'`))
	require.Zero(t, count(t, schema, `SELECT count(*) FROM ledger WHERE event_id = 'evt_killed'`))
	a.kill(t)
	require.Error(t, (<-dropped).err, "the provider sees the connection drop")

	done, before := deliverUntilDone(t, body, b.url)
	require.False(t, done.replayed)
	// A renewed its lease every 10s/3 until it died, so the first
	// redelivery finds it running for seconds yet: at least one 503.
	require.NotEmpty(t, before, "the first redelivery after the kill took the event over: the 503 while the dead process's lease runs went unexercised")
	for _, got := range before {
		require.NoError(t, got.err)
		require.Equal(t, http.StatusServiceUnavailable, got.status, "%s", got.body)
		require.Equal(t, idemhttp.ProblemWebhookEventInProgress, got.problem)
	}
	var resp Response
	require.NoError(t, json.Unmarshal(done.body, &resp))
	require.True(t, resp.Received)
	require.NotNil(t, resp.LedgerEntry)
	requireOnceEach(t, schema, "", []string{"evt_killed"})
	require.Equal(t, 4200, count(t, schema, `SELECT amount FROM ledger WHERE id = $1`, *resp.LedgerEntry))

	again := deliver(b.url, body, "")
	require.NoError(t, again.err)
	require.True(t, again.replayed)
	require.Equal(t, done.body, again.body)
	requireOnceEach(t, schema, "", []string{"evt_killed"})
	t.Logf("serve A killed (SIGKILL) in %s of evt_killed; serve B answered %d redeliveries 503 while A's 10s lease ran, then finished it: 1 event row, 1 ledger entry",
		PhaseLedgerBooked, len(before))
}
