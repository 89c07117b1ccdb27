package ridesapp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/examples/internal/clients"
	"github.com/go-idem/idem/examples/rides/fakepay"
	"github.com/go-idem/idem/examples/rides/internal/ridesapp"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/pgstore"
)

// The rides service across a failover of its database: two rides servers
// (the app, its River worker and idem's Maintainer, as Serve assembles
// them) on a primary and a streaming standby (internal/pgtest's pair), with
// clients that retry every request until it has a final answer. The
// primary is killed with requests in flight and the standby promoted; the
// servers carry on without a restart, through the multi-host URL.
//
// With an asynchronous standby that lost the last seconds, acknowledged
// requests are lost, and the test checks that the downstream idempotency
// key (derived from the request) lets the provider recognise their retries:
// no request is charged twice, even after every answered request is sent
// again. With a synchronous standby nothing acknowledged is lost and every
// answer replays byte for byte.

const (
	// failoverWarmRequests are answered, and replicated, before anything
	// goes wrong.
	failoverWarmRequests = 16
	// failoverLateRequests are answered in the last seconds before the
	// kill; an asynchronous standby receives none of them.
	failoverLateRequests = 24
	// failoverClients send requests at once; as many are in flight, held
	// at the provider, when the primary dies.
	failoverClients = 4
	// failoverMaxAttempts bounds the attempts of one request.
	failoverMaxAttempts = 500
	// failoverTestTimeout bounds a failover test once its pair has started.
	failoverTestTimeout = 10 * time.Minute
)

// An asynchronous standby that received nothing of the last seconds: the
// requests answered then, and those in flight at the kill, are gone from the
// new primary. Their retries run again, and the provider recognises each by
// its downstream key: nobody is charged twice.
func TestFailoverAsyncStandbyChargesNoRequestTwice(t *testing.T) {
	t.Parallel()
	f := newRidesFailover(t, false)
	fig := f.run()
	t.Logf("rides failover, asynchronous standby: %s", fig)

	require.Equal(t, failoverLateRequests, fig.lost,
		"the requests acknowledged while the standby received nothing are gone from the new primary")
	require.Equal(t, failoverClients, fig.lostInFlight, "so are the requests in flight at the kill")
	require.Zero(t, fig.lockedAtKill)
	require.Zero(t, fig.conflicts, "no key was held")
	require.Zero(t, fig.doubleCharges, "a lost request's retry reuses its downstream key, and the provider returns the first charge")
	require.Equal(t, failoverLateRequests, fig.reExecuted,
		"a re-sent request whose answer was lost with the primary runs again (and is charged once); every other re-send replays")
	require.LessOrEqual(t, fig.replaysDiffering, fig.reExecuted)
}

// A synchronous standby has every commit a client was told about: nothing is
// lost, every re-sent request replays its first answer byte for byte, and the
// keys in flight at the kill are resumed once their lease runs out.
func TestFailoverSyncStandbyLosesNoAcknowledgedRequest(t *testing.T) {
	t.Parallel()
	f := newRidesFailover(t, true)
	fig := f.run()
	t.Logf("rides failover, synchronous standby: %s", fig)

	require.Zero(t, fig.lost, "every 201 a client got is on the new primary")
	require.Zero(t, fig.lostInFlight)
	require.Equal(t, failoverClients, fig.lockedAtKill,
		"the keys in flight at the kill were replicated, locked; they are taken over once their lease ends")
	require.EqualValues(t, failoverClients, fig.conflicts, "each answered 409 until its lease was over")
	require.Zero(t, fig.doubleCharges)
	require.Zero(t, fig.reExecuted, "every re-sent request replays")
	require.Zero(t, fig.replaysDiffering, "every replay is the first answer, byte for byte")
}

// ridesFailover is one failover run: the pair, the provider, the servers
// and the clients' requests.
type ridesFailover struct {
	t           *testing.T
	ctx         context.Context
	synchronous bool
	pair        *pgtest.Pair
	admin       *pgxpool.Pool
	provider    *fakepay.Server
	gate        chargeGate
	clock       *idemtest.Clock
	servers     []*ridesServer
	client      *http.Client

	// leaseOver is closed once the test clock has moved on by a lease:
	// until then a client that gets a 409 waits for it.
	leaseOver chan struct{}
	next      atomic.Int64 // round robin over the servers
	attempts  atomic.Int64
	failures  atomic.Int64 // 5xx and attempts without an answer
	conflicts atomic.Int64 // 409s
}

func newRidesFailover(t *testing.T, synchronous bool) *ridesFailover {
	t.Helper()
	pair := pgtest.NewPair(t, &pgtest.PairOptions{Synchronous: synchronous, Logf: t.Logf})
	ctx, cancel := context.WithTimeout(context.Background(), failoverTestTimeout)
	t.Cleanup(cancel)

	f := &ridesFailover{
		t: t, ctx: ctx, synchronous: synchronous, pair: pair,
		clock:     idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
		client:    &http.Client{Timeout: time.Minute},
		leaseOver: make(chan struct{}),
	}
	var err error
	f.admin, err = pgxpool.New(ctx, pair.URL())
	require.NoError(t, err)
	t.Cleanup(f.admin.Close)
	require.NoError(t, ridesapp.Migrate(ctx, f.admin, "", testLogger))
	require.NoError(t, ridesapp.Seed(ctx, f.admin, ""))

	f.provider, err = fakepay.New(&fakepay.Config{Logger: testLogger, Test: fakepay.TestConfig{BeforeCharge: f.gate.wait}})
	require.NoError(t, err)
	providerServer := httptest.NewServer(f.provider)
	t.Cleanup(providerServer.Close)
	for range 2 {
		f.servers = append(f.servers, f.startServer(providerServer.URL))
	}
	return f
}

// ridesServer is a rides server as Serve assembles one: the app with its
// River worker, idem's Maintainer and the HTTP API, on a pool of its own.
type ridesServer struct {
	pool *pgxpool.Pool
	app  *ridesapp.App
	api  *httptest.Server
}

func (f *ridesFailover) startServer(paymentsURL string) *ridesServer {
	t := f.t
	poolConfig, err := pgxpool.ParseConfig(f.pair.URL())
	require.NoError(t, err)
	poolConfig.MaxConns = 10
	pool, err := pgxpool.NewWithConfig(f.ctx, poolConfig)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	app, err := ridesapp.New(&ridesapp.Config{
		Pool:     pool,
		Payments: &fakepay.Client{BaseURL: paymentsURL},
		Runner: &idem.Config{
			PhaseRetryBackoff: time.Millisecond,
			Test:              idem.TestConfig{Now: f.clock.Now},
		},
		Queue:  ridesapp.QueueConfig{Work: true},
		Logger: testLogger,
	})
	require.NoError(t, err)
	maintainer, err := idem.NewMaintainer(app.Runner(), &idem.MaintainerConfig{
		ReapInterval: 200 * time.Millisecond, CompleteInterval: 200 * time.Millisecond, ReconcileInterval: 200 * time.Millisecond,
	})
	require.NoError(t, err)

	workCtx, stopWork := context.WithCancel(context.Background())
	require.NoError(t, app.Start(workCtx))
	served := make(chan error, 1)
	go func() { served <- maintainer.Serve(workCtx) }()
	api := httptest.NewServer(app.Handler())
	t.Cleanup(func() {
		api.Close()
		stopWork()
		require.NoError(t, <-served)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, app.Stop(ctx))
	})
	return &ridesServer{pool: pool, app: app, api: api}
}

// failoverFigures is what a run measured.
type failoverFigures struct {
	requests      int
	acknowledged  int // 201s the clients had before the kill
	lost          int // of those, the requests whose key is not on the new primary, finished
	lostInFlight  int // requests in flight at the kill whose key is not on the new primary
	lockedAtKill  int // keys on the new primary still locked by the attempts the kill interrupted
	doubleCharges int // charges beyond the first, summed over requests
	charges       int // charges in the provider's ledger
	reExecuted    int // re-sent answered requests that ran again instead of replaying
	// replaysDiffering counts re-sends whose answer differs from the first.
	replaysDiffering int
	attempts         int64
	failures         int64
	conflicts        int64
	// recovery is from the kill to the first 201 for a request sent after
	// it; promoted, from the kill to the end of the standby's promotion.
	recovery, promoted time.Duration
}

func (g failoverFigures) String() string {
	return fmt.Sprintf("requests=%d acknowledged_before_kill=%d lost_acknowledged=%d in_flight_at_kill=%d lost_in_flight=%d keys_locked_at_kill=%d "+
		"charges=%d double_charges=%d re_sends_executed_again=%d re_sends_differing=%d attempts=%d failed_attempts=%d "+
		"conflicts=%d promoted_after=%s recovery=%s",
		g.requests, g.acknowledged, g.lost, failoverClients, g.lostInFlight, g.lockedAtKill, g.charges, g.doubleCharges, g.reExecuted, g.replaysDiffering,
		g.attempts, g.failures, g.conflicts, g.promoted.Round(time.Millisecond), g.recovery.Round(time.Millisecond))
}

// rideRequest is one client request: its key, and every final answer it got.
type rideRequest struct {
	key     string
	answers []*response
	// conflicted: an attempt got a 409.
	conflicted atomic.Bool
}

func newRideRequests(n int) []*rideRequest {
	qs := make([]*rideRequest, n)
	for i := range qs {
		qs[i] = &rideRequest{key: newKey()}
	}
	return qs
}

// run drives the service through the failover and checks what must hold in
// both modes; the caller checks the figures that differ.
func (f *ridesFailover) run() failoverFigures {
	t, ctx := f.t, f.ctx
	var fig failoverFigures

	// Before anything goes wrong: answered, replicated, receipts written.
	warm := newRideRequests(failoverWarmRequests)
	f.sendAll(warm, nil)
	f.waitReceipts()
	leaderBefore := f.waitRiverLeader()
	require.NoError(t, f.pair.WaitCaughtUp(ctx))

	// The last seconds: an asynchronous standby receives nothing more.
	if !f.synchronous {
		f.pair.HoldReplication()
	}
	late := newRideRequests(failoverLateRequests)
	f.sendAll(late, nil)
	f.waitReceipts()
	acknowledged := append(append([]*rideRequest(nil), warm...), late...)
	fig.acknowledged = len(acknowledged)

	// Requests in flight at the kill: each has created its ride and is held
	// at the provider, inside the charge phase.
	inFlight := newRideRequests(failoverClients)
	f.gate.hold(len(inFlight))
	interrupted, resume := make(chan struct{}, len(inFlight)), make(chan struct{})
	refused := make(chan struct{}, len(inFlight))
	inFlightDone := f.sendAllAsync(inFlight, func(q *rideRequest, attempt int, status int) {
		if attempt == 1 {
			// The attempt the kill interrupted: its client retries once the
			// test has looked at the new primary.
			interrupted <- struct{}{}
			select {
			case <-resume:
			case <-ctx.Done():
			}
		}
		if status == http.StatusConflict && q.conflicted.CompareAndSwap(false, true) {
			refused <- struct{}{}
		}
	})
	for range inFlight {
		select {
		case <-f.gate.arrived:
		case <-ctx.Done():
			t.Fatal("the requests never reached the provider")
		}
	}

	killed := time.Now()
	require.NoError(t, f.pair.KillPrimary())
	// The provider charges now, with no database to record it in: each
	// attempt fails, and with no writable server it cannot even release its
	// key.
	f.gate.release()
	for range inFlight {
		select {
		case <-interrupted:
		case <-ctx.Done():
			t.Fatal("the interrupted attempts never answered")
		}
	}
	// A new request, sent from the kill on, measures the time to recover.
	var recovered atomic.Int64
	probe := newRideRequests(1)
	probeDone := f.sendAllAsync(probe, func(_ *rideRequest, _ int, status int) {
		if status == http.StatusCreated {
			recovered.CompareAndSwap(0, int64(time.Since(killed)))
		}
	})
	require.NoError(t, f.pair.Promote(ctx))
	fig.promoted = time.Since(killed)
	// The test's own pool drops its connections to the dead primary rather
	// than fail its next queries on them; the servers' pools are left alone.
	f.admin.Reset()

	// What the new primary has of the requests answered before the kill,
	// and of those in flight at it.
	fig.lost = len(acknowledged) - f.countKeys(acknowledged, "status = 'finished'")
	fig.lostInFlight = len(inFlight) - f.countKeys(inFlight, "true")
	lease := f.servers[0].app.Runner().Config().Lease
	fig.lockedAtKill = f.countKeys(inFlight, "status = 'running' AND locked_at IS NOT NULL AND lease_expires_at = $2", f.clock.Now().Add(lease))
	close(resume)

	require.NoError(t, f.wait(probeDone))
	fig.recovery = time.Duration(recovered.Load())
	require.Positive(t, fig.recovery)

	// Keys locked by the interrupted attempts stay locked for their lease,
	// and no longer: the clients retrying them get 409 until the test
	// clock has moved on by exactly one lease. (With no key locked, the
	// clock stays put: moving it under running requests would only make
	// them fence themselves off.)
	for range fig.lockedAtKill {
		select {
		case <-refused:
		case <-ctx.Done():
			t.Fatal("a client retrying a locked key never got its 409")
		}
	}
	if fig.lockedAtKill > 0 {
		f.clock.Advance(lease)
	}
	close(f.leaseOver)
	require.NoError(t, f.wait(inFlightDone))

	// Every client sends every request it got an answer to once more.
	all := append(append(append([]*rideRequest(nil), acknowledged...), inFlight...), probe...)
	fig.requests = len(all)
	f.sendAll(all, nil)
	for _, q := range all {
		require.Len(t, q.answers, 2, "key %s", q.key)
		first, again := q.answers[0], q.answers[1]
		require.Equal(t, http.StatusCreated, first.status, "key %s: %s", q.key, first.body)
		require.Equal(t, http.StatusCreated, again.status, "key %s: %s", q.key, again.body)
		if again.header.Get("Idempotent-Replayed") != "true" {
			fig.reExecuted++
		}
		if !bytes.Equal(first.body, again.body) {
			fig.replaysDiffering++
		}
		require.Equal(t, f.chargeOf(first), f.chargeOf(again), "key %s: the re-sent request names another charge", q.key)
	}

	fig.charges, fig.doubleCharges = f.auditCharges(all)
	f.waitReceipts()
	f.requireSettled(len(all))
	f.requireServersOnNewPrimary()
	f.requireRiverLeaderMoved(leaderBefore)
	fig.attempts, fig.failures, fig.conflicts = f.attempts.Load(), f.failures.Load(), f.conflicts.Load()
	return fig
}

// attemptHook is told of every attempt of a request: its number and the
// status it got (0 for no answer).
type attemptHook func(q *rideRequest, attempt int, status int)

// sendAll sends the requests through failoverClients clients and returns
// once each has its final answer.
func (f *ridesFailover) sendAll(qs []*rideRequest, hook attemptHook) {
	f.t.Helper()
	require.NoError(f.t, f.wait(f.sendAllAsync(qs, hook)))
}

// sendAllAsync is sendAll in the background; wait for the channel.
func (f *ridesFailover) sendAllAsync(qs []*rideRequest, hook attemptHook) <-chan error {
	return clients.Start(qs, failoverClients, func(q *rideRequest) error { return f.send(q, hook) })
}

func (f *ridesFailover) wait(done <-chan error) error { return clients.Wait(f.ctx, done) }

// send posts q until it gets a final answer: anything but a 409, a 500, a
// 503 or no answer at all (a 502 is the provider's stored refusal). Attempts go to the servers round robin, with a short
// backoff after a failure. A 409 before the lease is over waits for it.
func (f *ridesFailover) send(q *rideRequest, hook attemptHook) error {
	backoff := 5 * time.Millisecond
	var last string
	for attempt := 1; attempt <= failoverMaxAttempts; attempt++ {
		f.attempts.Add(1)
		server := f.servers[int(f.next.Add(1))%len(f.servers)]
		resp, err := f.post(server, q.key)
		status := 0
		if err == nil {
			status = resp.status
		}
		if hook != nil {
			hook(q, attempt, status)
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("%d %s", resp.status, resp.body)
		}
		switch {
		case status == http.StatusConflict:
			f.conflicts.Add(1)
			select {
			case <-f.leaseOver:
			case <-f.ctx.Done():
				return fmt.Errorf("key %s: %w", q.key, f.ctx.Err())
			}
		case status == 0 || status == http.StatusInternalServerError || status == http.StatusServiceUnavailable:
			f.failures.Add(1)
		default:
			q.answers = append(q.answers, resp)
			return nil
		}
		if attempt > 1 && status != http.StatusConflict {
			backoff = min(2*backoff, 100*time.Millisecond)
		}
		timer := time.NewTimer(backoff)
		select {
		case <-timer.C:
		case <-f.ctx.Done():
			timer.Stop()
			return fmt.Errorf("key %s: %w", q.key, f.ctx.Err())
		}
	}
	return fmt.Errorf("key %s: no final answer in %d attempts; the last: %s", q.key, failoverMaxAttempts, last)
}

func (f *ridesFailover) post(server *ridesServer, key string) (*response, error) {
	req, err := http.NewRequestWithContext(f.ctx, http.MethodPost, server.api.URL+"/rides", strings.NewReader(validBody))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+ridesapp.GoodUserEmail)
	req.Header.Set("Idempotency-Key", key)
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &response{status: resp.StatusCode, header: resp.Header, body: body}, nil
}

func (f *ridesFailover) chargeOf(r *response) string {
	var ride ridesapp.RideResponse
	require.NoError(f.t, json.Unmarshal(r.body, &ride), "%s", r.body)
	require.NotEmpty(f.t, ride.ChargeID)
	return ride.ChargeID
}

// waitReceipts waits until every charged ride has its receipt: River's
// workers, on whichever server is the primary, have worked every job.
func (f *ridesFailover) waitReceipts() {
	f.poll("every charged ride has its receipt", func(ctx context.Context) (bool, error) {
		var missing int
		err := f.admin.QueryRow(ctx, `SELECT count(*) FROM rides r WHERE payment_status = 'charged'
			AND NOT EXISTS (SELECT 1 FROM receipts c WHERE c.ride_id = r.id)`).Scan(&missing)
		return missing == 0, err
	})
}

// poll asks the database until done says so, within the test's deadline:
// what it waits for is other goroutines' work (River's), which tells
// nobody when it is done.
func (f *ridesFailover) poll(what string, done func(ctx context.Context) (bool, error)) {
	f.t.Helper()
	ticker := time.NewTicker(20 * time.Millisecond)
	defer ticker.Stop()
	for {
		ok, err := done(f.ctx)
		if ok && err == nil {
			return
		}
		select {
		case <-ticker.C:
		case <-f.ctx.Done():
			f.t.Fatalf("waiting until %s: %v (last error: %v)", what, f.ctx.Err(), err)
		}
	}
}

func keysOf(qs []*rideRequest) []string {
	keys := make([]string, len(qs))
	for i, q := range qs {
		keys[i] = q.key
	}
	return keys
}

// countKeys counts the requests whose key is on the current primary and
// matches the condition (whose first placeholder is $2).
func (f *ridesFailover) countKeys(qs []*rideRequest, condition string, args ...any) int {
	n, err := clients.CountKeys(f.ctx, f.admin, keysOf(qs), condition, args...)
	require.NoError(f.t, err)
	return n
}

// auditCharges counts, per request, the distinct charges at the provider
// that belong to it: those under its downstream key (derived from the
// request, so the same on every primary), and those its answers named. It
// returns the ledger's size and the charges beyond one per request, and
// checks that every charge in the ledger belongs to a request.
func (f *ridesFailover) auditCharges(qs []*rideRequest) (charges, doubleCharges int) {
	t := f.t
	ledger := f.provider.Charges()
	byKey := map[string][]string{}
	for _, c := range ledger {
		byKey[c.IdempotencyKey] = append(byKey[c.IdempotencyKey], c.ID)
	}
	store, err := pgstore.New(f.admin, nil)
	require.NoError(t, err)
	defer store.Close()
	var userID int64
	require.NoError(t, f.admin.QueryRow(f.ctx, `SELECT id FROM users WHERE email = $1`, ridesapp.GoodUserEmail).Scan(&userID))
	owned := map[string]bool{}
	for _, q := range qs {
		rec, err := store.GetKey(f.ctx, "user:"+itoa(userID), q.key)
		require.NoError(t, err)
		mine := map[string]bool{}
		for _, id := range byKey[rec.DownstreamKey(ridesapp.PhaseChargeCreated)] {
			mine[id] = true
		}
		for _, a := range q.answers {
			mine[f.chargeOf(a)] = true
		}
		require.NotEmpty(t, mine)
		doubleCharges += len(mine) - 1
		for id := range mine {
			require.False(t, owned[id], "charge %s belongs to two requests", id)
			owned[id] = true
		}
	}
	for _, c := range ledger {
		require.True(t, owned[c.ID], "charge %s (%s, key %s) belongs to no request", c.ID, c.Description, c.IdempotencyKey)
	}
	return len(ledger), doubleCharges
}

// requireSettled checks the new primary: every key finished and unlocked,
// one ride per request, each charged with a charge the provider made.
func (f *ridesFailover) requireSettled(requests int) {
	t := f.t
	var unfinished, rides, charged int
	require.NoError(t, f.admin.QueryRow(f.ctx, `SELECT
		(SELECT count(*) FROM idem_keys WHERE status <> 'finished'),
		(SELECT count(*) FROM rides),
		(SELECT count(DISTINCT charge_id) FROM rides WHERE payment_status = 'charged')`).Scan(&unfinished, &rides, &charged))
	require.Zero(t, unfinished, "keys unfinished or locked on the new primary")
	require.Equal(t, requests, rides, "one ride per request on the new primary")
	require.Equal(t, requests, charged, "every ride charged, each with its own charge")
}

// requireServersOnNewPrimary checks that each server's pool now talks to
// the promoted standby: the multi-host URL moved them without a restart.
func (f *ridesFailover) requireServersOnNewPrimary() {
	t := f.t
	standby, err := pgx.ParseConfig(f.pair.StandbyURL())
	require.NoError(t, err)
	for _, s := range f.servers {
		var port int
		require.NoError(t, s.pool.QueryRow(f.ctx, `SELECT inet_server_port()`).Scan(&port))
		require.Equal(t, int(standby.Port), port)
	}
}

// riverLeader is River's leadership row.
type riverLeader struct {
	id                 string
	electedAt, expires time.Time
}

// waitRiverLeader waits until one of the servers is River's leader.
func (f *ridesFailover) waitRiverLeader() riverLeader {
	ids := f.riverClients()
	var l riverLeader
	f.poll("a server is River's leader", func(ctx context.Context) (bool, error) {
		var live bool
		err := f.admin.QueryRow(ctx, `SELECT leader_id, elected_at, expires_at, expires_at > now() FROM river_leader`).
			Scan(&l.id, &l.electedAt, &l.expires, &live)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return live && ids[l.id], err
	})
	return l
}

func (f *ridesFailover) riverClients() map[string]bool {
	ids := map[string]bool{}
	for _, s := range f.servers {
		ids[s.app.River().ID()] = true
	}
	return ids
}

// requireRiverLeaderMoved waits until River's elector has written its
// leadership on the new primary: a live leader row, one of the servers', that
// is not the row replicated from the old primary (re-elected since, or newly
// elected).
func (f *ridesFailover) requireRiverLeaderMoved(before riverLeader) {
	ids := f.riverClients()
	var after riverLeader
	f.poll("River elects a leader on the new primary", func(ctx context.Context) (bool, error) {
		var live bool
		err := f.admin.QueryRow(ctx, `SELECT leader_id, elected_at, expires_at, expires_at > now() FROM river_leader`).
			Scan(&after.id, &after.electedAt, &after.expires, &live)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return live && ids[after.id] && after.expires.After(before.expires), err
	})
	f.t.Logf("River leader: %s (elected %s) before the failover, %s (elected %s) after",
		before.id, before.electedAt.Format(time.RFC3339Nano), after.id, after.electedAt.Format(time.RFC3339Nano))
}

// chargeGate holds charges at the provider, so that requests are in flight
// inside their charge phase at a moment of the test's choosing.
type chargeGate struct {
	mu      sync.Mutex
	held    chan struct{}
	arrived chan string
}

// hold makes the next n charges wait, each announcing itself on arrived,
// until release.
func (g *chargeGate) hold(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held, g.arrived = make(chan struct{}), make(chan string, n)
}

func (g *chargeGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.held)
	g.held = nil
}

// wait is fakepay's BeforeCharge hook.
func (g *chargeGate) wait(ctx context.Context, key string) {
	g.mu.Lock()
	held, arrived := g.held, g.arrived
	g.mu.Unlock()
	if held == nil {
		return
	}
	arrived <- key
	select {
	case <-held:
	case <-ctx.Done():
	}
}
