// Package simulate drives the rides API the way unreliable clients on
// unreliable networks do, then audits what happened.
//
// Many concurrent clients each create rides. Every ride request gets a fresh
// UUID Idempotency-Key and is retried with the same key and the same body
// (with backoff, honouring Retry-After) until it reaches a final status: 201
// for a ride, 402 for a declined card. On top of the server-side faults the
// demo injects (a payment provider that fails, drops connections after
// charging and answers slowly; servers killed with SIGKILL), the clients add
// their own:
//
//   - a share of attempts gives up after a timeout shorter than the server's
//     latency, so the server keeps working on a request nobody waits for;
//   - a share of requests is sent twice at once, with the same key, as a
//     client with a retry bug would;
//   - a share of requests comes from the user whose card is always declined.
//
// When the traffic is over, the audit checks the API's answers, the database
// and the payment provider's ledger against each other (see [Report] for
// what each line of the summary means) and Report.OK says whether every
// invariant holds.
package simulate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem/examples/rides/fakepay"
	"github.com/go-idem/idem/examples/rides/internal/ridesapp"
)

// Config configures a simulation. Targets, Pool and Payments are required;
// every other field has a default.
type Config struct {
	// Targets are the base URLs of the rides servers. Attempts go to them
	// round robin, as through a load balancer, so a retry usually lands on
	// another server than the attempt before it.
	Targets []string

	// Clients is how many requests are in flight at once. Default 8.
	Clients int

	// Duration is how long new requests are started, after each client's
	// first, which it always sends. Requests in flight
	// when it ends are still retried to a final status. Default 20s.
	Duration time.Duration

	// Requests, when positive, stops starting requests after that many,
	// even before Duration is over.
	Requests int

	// DeclinedShare is the share of requests made as the user whose card is
	// always declined. Default 0.1; negative means none.
	DeclinedShare float64

	// DuplicateShare is the share of requests sent twice at once with the
	// same key. Default 0.1; negative means none.
	DuplicateShare float64

	// TimeoutShare is the share of attempts that give up after ShortTimeout
	// instead of Timeout. Default 0.1; negative means none.
	TimeoutShare float64

	// ShortTimeout is the client timeout of the impatient attempts; make it
	// shorter than the server's latency. Default 10ms.
	ShortTimeout time.Duration

	// Timeout is every other attempt's client timeout. Default 15s.
	Timeout time.Duration

	// Drain bounds how long, after Duration, requests in flight may keep
	// retrying, and then how long the audit waits for the server's
	// background work (receipt jobs, abandoned keys) to settle. Default 60s.
	Drain time.Duration

	// Pool is the rides database, for the audit.
	Pool *pgxpool.Pool

	// Schema is the schema of the rides tables; empty uses search_path.
	Schema string

	// Payments lists the payment provider's ledger, for the audit.
	Payments *fakepay.Client

	// HTTPClient sends the API requests. Default: a client with a
	// keep-alive pool sized for Clients.
	HTTPClient *http.Client

	// Logger receives progress lines. Default slog.Default().
	Logger *slog.Logger
}

func (c *Config) withDefaults() (*Config, error) {
	out := *c
	if len(out.Targets) == 0 {
		return nil, errors.New("simulate: Config.Targets is empty")
	}
	if out.Pool == nil {
		return nil, errors.New("simulate: Config.Pool is required for the audit")
	}
	if out.Payments == nil {
		return nil, errors.New("simulate: Config.Payments is required for the audit")
	}
	if out.Clients == 0 {
		out.Clients = 8
	}
	if out.Clients < 0 {
		return nil, fmt.Errorf("simulate: Clients %d is negative", out.Clients)
	}
	if out.Duration == 0 {
		out.Duration = 20 * time.Second
	}
	share := func(name string, v *float64) error {
		switch {
		case *v == 0:
			*v = 0.1
		case *v < 0:
			*v = 0
		case *v > 1:
			return fmt.Errorf("simulate: %s %v is over 1", name, *v)
		}
		return nil
	}
	for name, v := range map[string]*float64{"DeclinedShare": &out.DeclinedShare, "DuplicateShare": &out.DuplicateShare, "TimeoutShare": &out.TimeoutShare} {
		if err := share(name, v); err != nil {
			return nil, err
		}
	}
	if out.ShortTimeout == 0 {
		out.ShortTimeout = 10 * time.Millisecond
	}
	if out.Timeout == 0 {
		out.Timeout = 15 * time.Second
	}
	if out.Drain == 0 {
		out.Drain = 60 * time.Second
	}
	if out.HTTPClient == nil {
		out.HTTPClient = &http.Client{Transport: &http.Transport{
			MaxIdleConns:        4 * out.Clients,
			MaxIdleConnsPerHost: 4 * out.Clients,
			IdleConnTimeout:     30 * time.Second,
		}}
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return &out, nil
}

// request is one logical ride request: one key, one body, retried to a final
// status by one sender, or two when it is sent as a duplicate.
type request struct {
	key      string
	email    string
	body     []byte
	declined bool // sent as the declined user: a 402 is the right answer

	mu       sync.Mutex
	finished bool
	status   int
	response []byte
	// disagreements counts final answers (of a duplicate sender) that
	// differ from the first one.
	disagreements int
}

// final records a sender's final answer.
func (q *request) final(status int, body []byte) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.finished {
		q.finished, q.status, q.response = true, status, body
		return
	}
	if status != q.status || !bytes.Equal(body, q.response) {
		q.disagreements++
	}
}

// stats are the traffic counters, updated by every sender.
type stats struct {
	attempts, duplicates, replays, conflicts       atomic.Int64
	serverErrors, clientTimeouts, connectionErrors atomic.Int64

	mu        sync.Mutex
	latencies []time.Duration
}

func (s *stats) latency(d time.Duration) {
	s.mu.Lock()
	s.latencies = append(s.latencies, d)
	s.mu.Unlock()
}

type simulator struct {
	cfg     *Config
	stats   stats
	next    atomic.Uint64 // round-robin target index
	started time.Time
	since   time.Time // the database's clock when the run started
}

// Run runs the simulation and the audit. The error is for a simulation that
// could not be carried out (the database or the ledger unreachable, ctx
// cancelled); a run whose invariants fail returns a report with OK false and
// a nil error.
func Run(ctx context.Context, config *Config) (*Report, error) {
	cfg, err := config.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &simulator{cfg: cfg, started: time.Now()}
	// The audit looks at this run's rides and keys only, so a database that
	// has seen earlier runs (with another provider's ledger) still audits
	// cleanly. The database's clock decides what "this run" is.
	if err := cfg.Pool.QueryRow(ctx, `SELECT now()`).Scan(&s.since); err != nil {
		return nil, fmt.Errorf("simulate: reach the database: %w", err)
	}
	stopStarting := s.started.Add(cfg.Duration)
	// Requests in flight keep retrying past Duration, but not forever: a
	// request still unfinished at this deadline is reported as such.
	retryCtx, cancel := context.WithDeadline(ctx, stopStarting.Add(cfg.Drain))
	defer cancel()

	var (
		mu       sync.Mutex
		requests []*request
		wg       sync.WaitGroup
		started  atomic.Int64
	)
	progressDone := make(chan struct{})
	go s.progress(ctx, &started, progressDone)
	for range cfg.Clients {
		wg.Go(func() {
			// Each client sends at least one request: on a loaded machine
			// the window may have passed before the clients start, and a
			// run with nothing to audit proves nothing.
			for first := true; (first || time.Now().Before(stopStarting)) && ctx.Err() == nil; first = false {
				n := started.Add(1)
				if cfg.Requests > 0 && n > int64(cfg.Requests) {
					return
				}
				q := s.newRequest(n - 1)
				mu.Lock()
				requests = append(requests, q)
				mu.Unlock()
				s.send(retryCtx, q)
			}
		})
	}
	wg.Wait()
	close(progressDone)
	trafficEnded := time.Now()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("simulate: interrupted: %w", err)
	}

	cfg.Logger.Info("simulate: traffic done; checking replays and auditing", "requests", len(requests),
		"elapsed", trafficEnded.Sub(s.started).Round(time.Millisecond).String())
	report := s.tally(requests, trafficEnded)
	s.checkReplays(retryCtx, requests, report)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("simulate: interrupted: %w", err)
	}
	auditDeadline := time.Now().Add(cfg.Drain)
	if err := s.audit(ctx, auditDeadline, requests, report); err != nil {
		return nil, err
	}
	return report, nil
}

// newRequest makes a ride request with random coordinates.
// newRequest makes the run's nth request (from 0). The declined user's are
// DeclinedShare of them exactly, the first among them, rather than drawn at
// random: a short run (few requests, on a loaded machine) still has some.
func (s *simulator) newRequest(n int64) *request {
	q := &request{key: uuid.NewString(), email: ridesapp.GoodUserEmail}
	if share := s.cfg.DeclinedShare; share > 0 && math.Ceil(float64(n+1)*share) > math.Ceil(float64(n)*share) {
		q.email, q.declined = ridesapp.BadSourceUserEmail, true
	}
	coordinate := func(limit float64) string {
		return strconv.FormatFloat((rand.Float64()*2-1)*limit, 'f', 6, 64)
	}
	q.body = fmt.Appendf(nil, `{"origin_lat": %s, "origin_lon": %s, "target_lat": %s, "target_lon": %s}`,
		coordinate(90), coordinate(180), coordinate(90), coordinate(180))
	return q
}

// send retries q to a final status, from one sender or, for a share of
// requests, from two at once.
func (s *simulator) send(ctx context.Context, q *request) {
	if rand.Float64() >= s.cfg.DuplicateShare {
		s.retryToFinal(ctx, q, &s.stats, false)
		return
	}
	s.stats.duplicates.Add(1)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { s.retryToFinal(ctx, q, &s.stats, false) })
	}
	wg.Wait()
}

// answer is one attempt's outcome.
type answer struct {
	status     int
	body       []byte
	replayed   bool
	retryAfter time.Duration
	err        error
}

// isFinal reports whether an answer ends the request: any status but the
// ones that ask for a retry (409 in progress, 429, 408, 5xx).
func (a answer) isFinal() bool {
	if a.err != nil {
		return false
	}
	switch {
	case a.status == http.StatusConflict, a.status == http.StatusTooManyRequests,
		a.status == http.StatusRequestTimeout, a.status >= 500:
		return false
	}
	return true
}

// retryToFinal sends q until a final answer or ctx ends, and records the
// final answer on q. The final replay check sets patient: its attempts are
// never cut short, and its answers are compared with q's rather than
// recorded on it.
func (s *simulator) retryToFinal(ctx context.Context, q *request, st *stats, patient bool) answer {
	backoff := 25 * time.Millisecond
	for {
		a := s.attempt(ctx, q, st, patient)
		if a.isFinal() {
			if !patient {
				q.final(a.status, a.body)
			}
			return a
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, time.Second)
		wait = max(wait, a.retryAfter)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return answer{err: ctx.Err()}
		case <-t.C:
		}
	}
}

// attempt sends q once to the next target.
func (s *simulator) attempt(ctx context.Context, q *request, st *stats, patient bool) answer {
	timeout := s.cfg.Timeout
	short := !patient && rand.Float64() < s.cfg.TimeoutShare
	if short {
		timeout = s.cfg.ShortTimeout
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	target := s.cfg.Targets[s.next.Add(1)%uint64(len(s.cfg.Targets))]
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target+"/rides", bytes.NewReader(q.body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+q.email)
	req.Header.Set("Idempotency-Key", q.key)
	// net/http would silently resend a request with an Idempotency-Key on a
	// reused connection that died; the simulator counts its own retries.
	req.GetBody = nil

	began := time.Now()
	st.attempts.Add(1)
	resp, err := s.cfg.HTTPClient.Do(req)
	var body []byte
	if err == nil {
		body, err = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
	}
	st.latency(time.Since(began))
	if err != nil {
		switch {
		case parent.Err() != nil:
			// The run's deadline or an interrupt, not the attempt's fault.
		case ctx.Err() != nil:
			st.clientTimeouts.Add(1)
		default:
			st.connectionErrors.Add(1)
		}
		return answer{err: err}
	}
	a := answer{status: resp.StatusCode, body: body, replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
		a.retryAfter = time.Duration(secs) * time.Second
	}
	switch {
	case a.replayed:
		st.replays.Add(1)
	case resp.StatusCode == http.StatusConflict:
		st.conflicts.Add(1)
	case resp.StatusCode >= 500:
		st.serverErrors.Add(1)
	}
	return a
}

// progress logs a line every five seconds while the traffic runs.
func (s *simulator) progress(ctx context.Context, started *atomic.Int64, done <-chan struct{}) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-done:
			return
		case <-t.C:
			s.cfg.Logger.Info("simulate: progress",
				"elapsed", time.Since(s.started).Round(time.Second).String(),
				"requests", started.Load(),
				"attempts", s.stats.attempts.Load(),
				"conflicts", s.stats.conflicts.Load(),
				"server_errors", s.stats.serverErrors.Load(),
				"connection_errors", s.stats.connectionErrors.Load())
		}
	}
}
