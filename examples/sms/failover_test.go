package sms_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/examples/internal/clients"
	"github.com/go-idem/idem/examples/sms"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/pgstore"
)

// The sms flow across a failover of its database: a runner and idem's
// Maintainer on a primary and a streaming standby (internal/pgtest's pair),
// clients that retry every request until it has a final answer, the primary
// killed with sends in flight, the standby promoted.
//
// The gateway has no idempotency key: what keeps a message from going out
// twice is idem's durable memory of the attempt, the foreign mark written
// before the call and the commit after it. A synchronous standby keeps that
// memory, so nothing is sent twice: the sends in flight at the kill go to
// needs_reconcile and the Maintainer's reconcile run finds them at the
// gateway. An asynchronous standby that lost the last seconds lost it too:
// the retry of a request it forgot is a new request and sends again. No
// design can tell such a retry from a new request without that memory, so
// the test measures how many messages went out twice rather than pretend
// otherwise.

const (
	smsFailoverWarm    = 8  // sent, and replicated, before anything goes wrong
	smsFailoverLate    = 12 // sent in the last seconds before the kill
	smsFailoverClients = 3  // requests at once; as many in flight at the kill
	// smsFailoverMaxAttempts bounds the attempts of one request.
	smsFailoverMaxAttempts = 500
	smsFailoverTimeout     = 10 * time.Minute
)

// An asynchronous standby: every request whose key (with its mark, or with
// the commit that cleared it) died with the primary can be sent twice; the
// test counts how many were, and checks nothing else was.
func TestFailoverAsyncStandbyRepeatsOnlyForgottenSends(t *testing.T) {
	t.Parallel()
	f := newSMSFailover(t, false)
	fig := f.run()
	t.Logf("sms failover, asynchronous standby: %s", fig)
	t.Logf("sms failover, asynchronous standby: %d of %d requests whose memory died with the primary sent their message twice",
		fig.sentTwice, fig.forgotten())

	require.Equal(t, smsFailoverLate, fig.lost, "the requests answered while the standby received nothing are gone")
	require.Equal(t, smsFailoverClients, fig.lostInFlight, "so are the sends in flight at the kill, marks and all")
	require.Zero(t, fig.markedAtKill)
	require.LessOrEqual(t, fig.sentTwice, fig.forgotten(), "only a request idem forgot is sent twice")
	require.Zero(t, fig.sentMore, "never more than twice")
	require.Zero(t, fig.rememberedSentTwice, "a request whose key survived is never sent again")
}

// A synchronous standby keeps every mark: the sends in flight at the kill are
// reconciled, not repeated, and no message goes out twice.
func TestFailoverSyncStandbySendsNoMessageTwice(t *testing.T) {
	t.Parallel()
	f := newSMSFailover(t, true)
	fig := f.run()
	t.Logf("sms failover, synchronous standby: %s", fig)

	require.Zero(t, fig.lost, "every answered request is on the new primary")
	require.Zero(t, fig.lostInFlight)
	require.Equal(t, smsFailoverClients, fig.markedAtKill, "the sends in flight at the kill left their marks, locked")
	require.Equal(t, smsFailoverClients, fig.reconciled, "the Maintainer's reconcile run found each at the gateway")
	require.Zero(t, fig.sentTwice)
	require.Zero(t, fig.reExecuted, "every re-sent request replays")
	require.Zero(t, fig.replaysDiffering, "byte for byte")
}

type smsFailover struct {
	t           *testing.T
	ctx         context.Context
	synchronous bool
	pair        *pgtest.Pair
	pool        *pgxpool.Pool
	gateway     *gatedGateway
	sender      *sms.Sender
	runner      *idem.Runner
	clock       *idemtest.Clock
	reconciled  atomic.Int64

	// leaseOver and reconcileDue are closed once the test clock has moved
	// on by a lease, and by the reconcile runs' IdleFor: until then a client
	// that finds its key held, or in needs_reconcile, waits for them.
	leaseOver, reconcileDue chan struct{}
	attempts, failures      atomic.Int64
}

const smsReconcileIdleFor = time.Minute

func newSMSFailover(t *testing.T, synchronous bool) *smsFailover {
	t.Helper()
	pair := pgtest.NewPair(t, &pgtest.PairOptions{Synchronous: synchronous, Logf: t.Logf})
	ctx, cancel := context.WithTimeout(context.Background(), smsFailoverTimeout)
	t.Cleanup(cancel)
	f := &smsFailover{
		t: t, ctx: ctx, synchronous: synchronous, pair: pair,
		gateway:   &gatedGateway{},
		clock:     idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
		leaseOver: make(chan struct{}), reconcileDue: make(chan struct{}),
	}
	poolConfig, err := pgxpool.ParseConfig(pair.URL())
	require.NoError(t, err)
	poolConfig.MaxConns = 8
	// Every connection is pinged before it is handed out (the store's
	// control pool copies this), so no statement after the promotion draws a
	// connection to the dead primary: a reconcile run that did would leave
	// its key for another IdleFor. (The rides test shows clients riding
	// through those with pgxpool's default.)
	poolConfig.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return true }
	f.pool, err = pgxpool.NewWithConfig(ctx, poolConfig)
	require.NoError(t, err)
	t.Cleanup(f.pool.Close)
	require.NoError(t, sms.Migrate(ctx, f.pool, ""))
	store, err := pgstore.New(f.pool, nil)
	require.NoError(t, err)
	t.Cleanup(store.Close)
	f.sender, err = sms.NewSender(f.gateway, "")
	require.NoError(t, err)
	f.runner, err = idem.NewRunner(store, &idem.Config{
		Flows:  []idem.AnyFlow{f.sender.Flow()},
		Logger: slog.New(slog.DiscardHandler),
		Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) {
			if e.Kind == idem.EventReconciled && e.Err == nil && e.Verdict == "happened" {
				f.reconciled.Add(1)
			}
		}),
		Test: idem.TestConfig{Now: f.clock.Now},
	})
	require.NoError(t, err)

	maintainer, err := idem.NewMaintainer(f.runner, &idem.MaintainerConfig{
		ReapInterval: 100 * time.Millisecond, CompleteInterval: 100 * time.Millisecond, ReconcileInterval: 50 * time.Millisecond,
		Reconcile: idem.ReconcileConfig{IdleFor: smsReconcileIdleFor},
	})
	require.NoError(t, err)
	serveCtx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- maintainer.Serve(serveCtx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-served)
	})
	return f
}

type smsFigures struct {
	requests, acknowledged int
	lost                   int // answered requests whose key is not on the new primary, finished
	lostInFlight           int // requests in flight at the kill whose key is not on the new primary
	markedAtKill           int // keys on the new primary with the mark of an interrupted send, locked
	reconciled             int // reconcile verdicts of happened: the message was found at the gateway
	sent                   int // messages the gateway sent
	sentTwice              int // requests whose message went out twice
	sentMore               int // requests whose message went out more than twice
	rememberedSentTwice    int // of those sent twice, requests whose key had survived
	reExecuted             int // re-sent answered requests that ran again instead of replaying
	replaysDiffering       int // re-sends whose answer differs from the first
	attempts, failures     int64
	recovery               time.Duration
}

// forgotten is how many requests' memory (key, mark, commit) died with the
// primary.
func (g smsFigures) forgotten() int { return g.lost + g.lostInFlight }

func (g smsFigures) String() string {
	return fmt.Sprintf("requests=%d acknowledged_before_kill=%d lost_acknowledged=%d in_flight_at_kill=%d lost_in_flight=%d "+
		"marks_at_kill=%d reconciled=%d messages=%d sent_twice=%d re_sends_executed_again=%d re_sends_differing=%d "+
		"attempts=%d failed_attempts=%d recovery=%s",
		g.requests, g.acknowledged, g.lost, smsFailoverClients, g.lostInFlight, g.markedAtKill, g.reconciled, g.sent,
		g.sentTwice, g.reExecuted, g.replaysDiffering, g.attempts, g.failures, g.recovery.Round(time.Millisecond))
}

// smsRequest is one client request: its key, its text (unique, so the
// gateway's messages can be told apart) and every final answer it got.
type smsRequest struct {
	key     string
	params  sms.Params
	answers []*idem.Outcome
	// held and needsReconcile: an attempt found the key held by another
	// worker, or in needs_reconcile.
	held, needsReconcile atomic.Bool
}

var smsRequestSeq atomic.Int64

func newSMSRequests(n int) []*smsRequest {
	qs := make([]*smsRequest, n)
	for i := range qs {
		seq := smsRequestSeq.Add(1)
		qs[i] = &smsRequest{key: fmt.Sprintf("sms-failover-%d", seq), params: sms.Params{To: "+15550100", Text: fmt.Sprintf("message %d", seq)}}
	}
	return qs
}

func (f *smsFailover) run() smsFigures {
	t, ctx := f.t, f.ctx
	var fig smsFigures

	warm := newSMSRequests(smsFailoverWarm)
	f.sendAll(warm, nil)
	require.NoError(t, f.pair.WaitCaughtUp(ctx))
	if !f.synchronous {
		f.pair.HoldReplication()
	}
	late := newSMSRequests(smsFailoverLate)
	f.sendAll(late, nil)
	acknowledged := append(append([]*smsRequest(nil), warm...), late...)
	fig.acknowledged = len(acknowledged)

	// Sends in flight at the kill: each has recorded its attempt (the mark)
	// and is held at the gateway.
	inFlight := newSMSRequests(smsFailoverClients)
	f.gateway.hold(len(inFlight))
	interrupted, resume := make(chan struct{}, len(inFlight)), make(chan struct{})
	held, parked := make(chan struct{}, len(inFlight)), make(chan struct{}, len(inFlight))
	inFlightDone := f.sendAllAsync(inFlight, func(q *smsRequest, attempt int, err error) {
		switch {
		case attempt == 1:
			interrupted <- struct{}{}
			select {
			case <-resume:
			case <-ctx.Done():
			}
		case errors.Is(err, idem.ErrInProgress) && q.held.CompareAndSwap(false, true):
			held <- struct{}{}
		case errors.Is(err, idem.ErrNeedsReconcile) && q.needsReconcile.CompareAndSwap(false, true):
			parked <- struct{}{}
		}
	})
	for range inFlight {
		select {
		case <-f.gateway.arrived:
		case <-ctx.Done():
			t.Fatal("the sends never reached the gateway")
		}
	}

	killed := time.Now()
	require.NoError(t, f.pair.KillPrimary())
	// The gateway sends now, with no database to record it in.
	f.gateway.release()
	for range inFlight {
		select {
		case <-interrupted:
		case <-ctx.Done():
			t.Fatal("the interrupted sends never returned")
		}
	}
	var recovered atomic.Int64
	probe := newSMSRequests(1)
	probeDone := f.sendAllAsync(probe, func(_ *smsRequest, _ int, err error) {
		if err == nil {
			recovered.CompareAndSwap(0, int64(time.Since(killed)))
		}
	})
	require.NoError(t, f.pair.Promote(ctx))
	require.NoError(t, f.wait(probeDone))
	fig.recovery = time.Duration(recovered.Load())
	require.Positive(t, fig.recovery)

	fig.lost = len(acknowledged) - f.countKeys(acknowledged, "status = 'finished'")
	fig.lostInFlight = len(inFlight) - f.countKeys(inFlight, "true")
	lease := f.runner.Config().Lease
	fig.markedAtKill = f.countKeys(inFlight, "status = 'running' AND foreign_mark = $2 AND lease_expires_at = $3",
		sms.PhaseSent, f.clock.Now().Add(lease))
	close(resume)

	// A marked key stays locked for its lease, then goes to needs_reconcile
	// (its send is in doubt), and the Maintainer's reconcile run, once the
	// key has been idle for IdleFor, asks the gateway.
	// (With no key marked, the clock stays put: moving it under running
	// requests would only make them fence themselves off.)
	f.receive(held, fig.markedAtKill, "a retry finds its key held")
	if fig.markedAtKill > 0 {
		f.clock.Advance(lease)
	}
	close(f.leaseOver)
	f.receive(parked, fig.markedAtKill, "a retry finds its key in needs_reconcile")
	if fig.markedAtKill > 0 {
		f.clock.Advance(smsReconcileIdleFor)
	}
	close(f.reconcileDue)
	require.NoError(t, f.wait(inFlightDone))
	fig.reconciled = int(f.reconciled.Load())

	all := append(append(append([]*smsRequest(nil), acknowledged...), inFlight...), probe...)
	fig.requests = len(all)
	f.sendAll(all, nil)
	for _, q := range all {
		require.Len(t, q.answers, 2, q.key)
		first, again := q.answers[0], q.answers[1]
		require.Equal(t, 201, first.Response.Status, "%s: %s", q.key, first.Response.Body)
		require.Equal(t, 201, again.Response.Status, "%s: %s", q.key, again.Response.Body)
		if again.Kind != idem.OutcomeReplayed {
			fig.reExecuted++
		}
		if !bytes.Equal(first.Response.Body, again.Response.Body) {
			fig.replaysDiffering++
		}
	}

	// Messages per request, by their unique text.
	sent := map[string]int{}
	for _, m := range f.gateway.Sent() {
		sent[m.Body]++
	}
	fig.sent = len(f.gateway.Sent())
	// Which requests' keys survived the failover: those before the standby
	// was held, and the probe sent after the kill; on a synchronous pair,
	// every one.
	survived := map[string]bool{probe[0].key: true}
	for _, q := range warm {
		survived[q.key] = true
	}
	if f.synchronous {
		for _, q := range all {
			survived[q.key] = true
		}
	}
	accounted := 0
	for _, q := range all {
		n := sent[q.params.Text]
		accounted += n
		require.Positive(t, n, "%s was never sent", q.key)
		switch {
		case n == 2:
			fig.sentTwice++
			if survived[q.key] {
				fig.rememberedSentTwice++
			}
		case n > 2:
			fig.sentMore++
		}
	}
	require.Equal(t, fig.sent, accounted, "every message the gateway sent is a request's")

	var unfinished int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM idem_keys WHERE status <> 'finished'`).Scan(&unfinished))
	require.Zero(t, unfinished, "keys unfinished or locked on the new primary")
	fig.attempts, fig.failures = f.attempts.Load(), f.failures.Load()
	return fig
}

func (f *smsFailover) receive(ch <-chan struct{}, n int, what string) {
	f.t.Helper()
	for range n {
		select {
		case <-ch:
		case <-f.ctx.Done():
			f.t.Fatalf("waiting until %s: %v", what, f.ctx.Err())
		}
	}
}

// countKeys counts the requests whose key is on the current primary and
// matches the condition (whose first placeholder is $2).
func (f *smsFailover) countKeys(qs []*smsRequest, condition string, args ...any) int {
	keys := make([]string, len(qs))
	for i, q := range qs {
		keys[i] = q.key
	}
	n, err := clients.CountKeys(f.ctx, f.pool, keys, condition, args...)
	require.NoError(f.t, err)
	return n
}

type smsAttemptHook func(q *smsRequest, attempt int, err error)

func (f *smsFailover) sendAll(qs []*smsRequest, hook smsAttemptHook) {
	f.t.Helper()
	require.NoError(f.t, f.wait(f.sendAllAsync(qs, hook)))
}

func (f *smsFailover) sendAllAsync(qs []*smsRequest, hook smsAttemptHook) <-chan error {
	return clients.Start(qs, smsFailoverClients, func(q *smsRequest) error { return f.send(q, hook) })
}

func (f *smsFailover) wait(done <-chan error) error { return clients.Wait(f.ctx, done) }

// send executes q until it has a final answer (a response, executed or
// replayed), retrying whatever else with a short backoff; a key held by
// another worker waits for the lease to be over, a key in needs_reconcile for
// the reconcile runs to be due.
func (f *smsFailover) send(q *smsRequest, hook smsAttemptHook) error {
	backoff := 5 * time.Millisecond
	var err error
	for attempt := 1; attempt <= smsFailoverMaxAttempts; attempt++ {
		f.attempts.Add(1)
		var out *idem.Outcome
		out, err = f.runner.Execute(f.ctx, f.sender.Flow(), idem.Request{Scope: "user:1", Key: q.key, Path: "/messages", Params: q.params})
		if hook != nil {
			hook(q, attempt, err)
		}
		var wait <-chan struct{}
		switch {
		case err == nil:
			q.answers = append(q.answers, out)
			return nil
		case errors.Is(err, idem.ErrInProgress) || errors.Is(err, idem.ErrLockLost):
			wait = f.leaseOver
		case errors.Is(err, idem.ErrNeedsReconcile):
			wait = f.reconcileDue
		default:
			f.failures.Add(1)
			backoff = min(2*backoff, 100*time.Millisecond)
		}
		if wait != nil {
			select {
			case <-wait:
			case <-f.ctx.Done():
				return fmt.Errorf("%s: %w (last error: %v)", q.key, f.ctx.Err(), err)
			}
		}
		timer := time.NewTimer(backoff)
		select {
		case <-timer.C:
		case <-f.ctx.Done():
			timer.Stop()
			return fmt.Errorf("%s: %w (last error: %v)", q.key, f.ctx.Err(), err)
		}
	}
	return fmt.Errorf("%s: no final answer in %d attempts; the last error: %w", q.key, smsFailoverMaxAttempts, err)
}

// gatedGateway is the fake gateway with a gate in front of Send, so that
// sends are in flight (marked, not yet answered) at a moment of the test's
// choosing.
type gatedGateway struct {
	sms.FakeGateway
	mu      sync.Mutex
	held    chan struct{}
	arrived chan struct{}
}

func (g *gatedGateway) hold(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held, g.arrived = make(chan struct{}), make(chan struct{}, n)
}

func (g *gatedGateway) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.held)
	g.held = nil
}

func (g *gatedGateway) Send(ctx context.Context, m sms.Outgoing) (*sms.Message, error) {
	g.mu.Lock()
	held, arrived := g.held, g.arrived
	g.mu.Unlock()
	if held != nil {
		arrived <- struct{}{}
		select {
		case <-held:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.FakeGateway.Send(ctx, m)
}
