package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
)

// smsGateway has no idempotency keys: every send is a new message. It can
// be asked what it sent, which is what a reconcile hook does.
type smsGateway struct {
	mu      sync.Mutex
	sent    map[string]int // message ref -> times sent
	lose    bool           // the next send fails without reaching the gateway
	unknown bool           // lookups cannot tell
}

func (g *smsGateway) send(ref string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lose {
		g.lose = false
		return errors.New("gateway timeout")
	}
	g.sent[ref]++
	return nil
}

func (g *smsGateway) times(ref string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.sent[ref]
}

type smsInput struct {
	To   string `json:"to"`
	Text string `json:"text"`
}

type smsBundle struct {
	*testBundle
	gateway *smsGateway
	flow    *idem.Flow[smsInput]
	// inSend runs inside the send phase after the foreign call, if set.
	inSend func(ctx context.Context, tx idem.Tx, run *idem.Attempt[smsInput]) error
}

func setupSMS(t *testing.T) *smsBundle { return setupSMSOn(t, setup(t)) }

// setupSMSOn adds the SMS flow and its table to a bundle.
func setupSMSOn(t *testing.T, tb *testBundle) *smsBundle {
	b := &smsBundle{testBundle: tb, gateway: &smsGateway{sent: map[string]int{}}}
	_, err := b.pool.Exec(context.Background(), `CREATE TABLE messages (id bigserial PRIMARY KEY, to_number text, sent bool NOT NULL DEFAULT false)`)
	require.NoError(t, err)
	b.flow = idem.MustNewFlow("sms.send", []idem.Phase[smsInput]{
		{
			Name: "message_saved",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[smsInput]) (idem.Result, error) {
				var id int64
				if err := tx.QueryRow(ctx, `INSERT INTO messages (to_number) VALUES ($1) RETURNING id`, run.Input().To).Scan(&id); err != nil {
					return idem.Result{}, err
				}
				return idem.Advance(), run.SetCheckpoint("message_id", id)
			},
		},
		{
			Name:    "sms_sent",
			Foreign: idem.ForeignNotIdempotent,
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[smsInput]) (idem.Result, error) {
				b.counts.Add("sms_sent")
				ref := run.IdempotencyKey() // used here only as our own reference
				if err := run.Foreign(ctx, "send_sms", func(context.Context, string) error { return b.gateway.send(ref) }); err != nil {
					return idem.Result{}, err
				}
				if b.inSend != nil {
					if err := b.inSend(ctx, tx, run); err != nil {
						return idem.Result{}, err
					}
				}
				return idem.Advance(), markSent(ctx, tx, run)
			},
			Reconcile: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[smsInput]) (idem.ReconcileVerdict, error) {
				b.counts.Add("reconcile")
				if b.gateway.unknown {
					return idem.ReconcileUnknown("gateway lookup timed out"), nil
				}
				if b.gateway.times(run.IdempotencyKey()) == 0 {
					return idem.ReconcileNotHappened(), nil
				}
				return idem.ReconcileHappened(idem.Advance()), markSent(ctx, tx, run)
			},
		},
		{
			Name: "responded",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[smsInput]) (idem.Result, error) {
				var id int64
				if _, err := run.Checkpoint("message_id", &id); err != nil {
					return idem.Result{}, err
				}
				return idem.RespondJSON(http.StatusCreated, map[string]any{"message_id": id}), nil
			},
		},
	}, nil)
	return b
}

func markSent(ctx context.Context, tx idem.Tx, run *idem.Attempt[smsInput]) error {
	var id int64
	if _, err := run.Checkpoint("message_id", &id); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `UPDATE messages SET sent = true WHERE id = $1`, id)
	return err
}

func (b *smsBundle) runner(t *testing.T, hook func(context.Context, idemtest.HookPoint) error) *idem.Runner {
	return b.testBundle.runner(t, &idem.Config{Flows: []idem.AnyFlow{b.flow}, Test: idemtest.WithHook(idem.TestConfig{}, hook)})
}

func (b *smsBundle) req(key string) idem.Request {
	return idem.Request{Scope: "user:1", Key: key, Params: smsInput{To: "+15550100", Text: "your ride is here"}}
}

// crashAfterSend runs key's request to a crash right after the gateway
// call: the key is left with its foreign mark set.
func (b *smsBundle) crashAfterSend(t *testing.T, key string) {
	t.Helper()
	crashing := b.runner(t, func(_ context.Context, at idemtest.HookPoint) error {
		if at.Where == idemtest.HookAfterForeign {
			return idemtest.ErrSimulatedCrash
		}
		return nil
	})
	_, err := crashing.Execute(context.Background(), b.flow, b.req(key))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
}

func (b *smsBundle) ref(t *testing.T, key string) string {
	return b.key(t, key).DownstreamKey("sms_sent")
}

func TestNotIdempotentCallRunsOnceWhenNothingGoesWrong(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	out, err := b.runner(t, nil).Execute(context.Background(), b.flow, b.req("k1"))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, 1, b.gateway.times(b.ref(t, "k1")))
	require.Empty(t, b.key(t, "k1").ForeignMark, "the commit retires the mark")
}

// A crash after the not-idempotent call: the resume finds the mark without
// the phase committed and sends the key to reconcile instead of re-sending.
// The reconcile hook finds the message sent, and the flow finishes.
func TestNotIdempotentCrashGoesToReconcileNotToASecondSend(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	ctx := context.Background()
	b.crashAfterSend(t, "k1")
	ref := b.ref(t, "k1")
	require.Equal(t, 1, b.gateway.times(ref))
	require.Equal(t, "sms_sent", b.key(t, "k1").ForeignMark)

	b.clock.Advance(2 * time.Minute)
	r := b.runner(t, nil)
	for i := 0; i < 2; i++ { // the takeover, then a plain retry
		out, err := r.Execute(ctx, b.flow, b.req("k1"))
		require.ErrorIs(t, err, idem.ErrNeedsReconcile)
		require.Equal(t, idem.OutcomeNeedsReconcile, out.Kind)
	}
	rec := b.key(t, "k1")
	require.Equal(t, idemtype.StoredNeedsReconcile, rec.Status)
	require.Nil(t, rec.LockedAt)
	require.Equal(t, 1, b.gateway.times(ref), "never re-sent blindly")

	out, err := r.Reconcile(ctx, "user:1", "k1")
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, http.StatusCreated, out.Response.Status)
	require.Equal(t, 1, b.gateway.times(ref))
	require.Equal(t, 1, b.countRows(t, "messages WHERE sent"), "the hook made the phase's local write")

	replay, err := r.Execute(ctx, b.flow, b.req("k1"))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, replay.Kind)
	require.Equal(t, out.Response.Body, replay.Response.Body)
	require.Equal(t, 1, b.counts.Get()["sms_sent"])
}

// A send that failed before reaching the gateway: the phase errs with the
// mark set, so the key goes straight to reconcile; the hook finds nothing
// sent, and the phase runs again, sending exactly once.
func TestNotIdempotentNotDoneRunsThePhaseAgain(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	ctx := context.Background()
	r := b.runner(t, nil)
	b.gateway.lose = true
	out, err := r.Execute(ctx, b.flow, b.req("k1"))
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	require.Equal(t, idem.OutcomeNeedsReconcile, out.Kind)
	ref := b.ref(t, "k1")
	require.Zero(t, b.gateway.times(ref))

	out, err = r.Reconcile(ctx, "user:1", "k1")
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, 1, b.gateway.times(ref))
	require.Equal(t, 2, b.counts.Get()["sms_sent"])
}

// Unknown leaves the key for later, unlocked, with the reason recorded.
func TestReconcileUnknownLeavesTheKeyForLater(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	ctx := context.Background()
	r := b.runner(t, nil)
	b.gateway.lose = true
	_, err := r.Execute(ctx, b.flow, b.req("k1"))
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)

	b.gateway.unknown = true
	out, err := r.Reconcile(ctx, "user:1", "k1")
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	require.Equal(t, idem.OutcomeNeedsReconcile, out.Kind)
	rec := b.key(t, "k1")
	require.Equal(t, idemtype.StoredNeedsReconcile, rec.Status)
	require.Nil(t, rec.LockedAt)
	require.Contains(t, rec.LastError, "gateway lookup timed out")

	b.gateway.unknown = false
	out, err = r.Reconcile(ctx, "user:1", "k1")
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Empty(t, b.key(t, "k1").LastError, "the hook's unknown is not a finished key's last error")

	_, err = r.Reconcile(ctx, "user:1", "k1")
	require.ErrorIs(t, err, idem.ErrNothingToReconcile)
	_, err = r.Reconcile(ctx, "user:1", "nope")
	require.ErrorIs(t, err, idem.ErrNotFound)
}

// A serialization failure after a not-idempotent call is not retried: the
// call may have happened, so the key goes to reconcile.
func TestNotIdempotentPhaseIsNotRetriedAfterItsCall(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	conflicts := 5
	conflict := b.conflictOnce(t, &conflicts)
	b.inSend = func(ctx context.Context, tx idem.Tx, _ *idem.Attempt[smsInput]) error { return conflict(ctx, tx, nil) }
	r := b.testBundle.runner(t, &idem.Config{Flows: []idem.AnyFlow{b.flow}, Isolation: pgx.RepeatableRead})
	out, err := r.Execute(context.Background(), b.flow, b.req("k1"))
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	require.Equal(t, idem.OutcomeNeedsReconcile, out.Kind)
	require.Equal(t, 1, b.counts.Get()["sms_sent"], "no automatic retry")
	require.Equal(t, 1, b.gateway.times(b.ref(t, "k1")))
}

// A phase may make one foreign call; the second is refused without calling.
func TestSecondForeignCallIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls int
	flow := idem.MustNewFlow("double", []idem.Phase[rideInput]{{
		Name: "charged_twice",
		Do: func(ctx context.Context, _ idem.Tx, run *idem.Attempt[rideInput]) (idem.Result, error) {
			call := func(context.Context, string) error { calls++; return nil }
			if err := run.Foreign(ctx, "charge", call); err != nil {
				return idem.Result{}, err
			}
			if err := run.Foreign(ctx, "charge again", call); err != nil {
				return idem.Result{}, err
			}
			return idem.RespondJSON(http.StatusOK, "ok"), nil
		},
	}}, nil)
	out, err := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{flow}}).Execute(context.Background(), flow, b.request("k1", rideInput{}))
	require.ErrorIs(t, err, idem.ErrSecondForeignCall)
	require.ErrorIs(t, err, idem.ErrPhaseFailed)
	require.Equal(t, idem.OutcomeFailed, out.Kind)
	require.Equal(t, 1, calls)
}

func TestInvalidRequestsWriteNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.runner(t, nil)
	long := make([]byte, 256)
	for i := range long {
		long[i] = 'k'
	}
	for name, req := range map[string]idem.Request{
		"empty scope":        {Scope: "", Key: "k", Params: rideInput{}},
		"empty key":          {Scope: "s", Key: "", Params: rideInput{}},
		"key of 256":         {Scope: "s", Key: string(long), Params: rideInput{}},
		"key with newline":   {Scope: "s", Key: "a\nb", Params: rideInput{}},
		"key not ascii":      {Scope: "s", Key: "clé", Params: rideInput{}},
		"params of a type":   {Scope: "s", Key: "k", Params: 42},
		"params not JSON":    {Scope: "s", Key: "k", Params: []byte(`{"origin":`)},
		"params wrong shape": {Scope: "s", Key: "k", Params: []byte(`{"origin": 7}`)},
		"nil params":         {Scope: "s", Key: "k", Params: (*rideInput)(nil)},
	} {
		out, err := r.Execute(ctx, b.flow, req)
		require.ErrorIs(t, err, idem.ErrInvalidRequest, name)
		require.Equal(t, idem.OutcomeInvalid, out.Kind, name)
	}
	require.Equal(t, 0, b.countRows(t, "idem_keys"))
	require.Empty(t, b.counts.Get())
}

// JSON params and typed params of equal value are the same request.
func TestParamsAsJSONOrValueFingerprintAlike(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.runner(t, nil)
	_, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	out, err := r.Execute(ctx, b.flow, idem.Request{Scope: "user:1", Key: "k1", Method: "POST", Path: "/rides", Params: []byte(` {"amount": 2e1, "origin":"SF"}`)})
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
}

func TestLastPhaseMustRespond(t *testing.T) {
	t.Parallel()
	b := setup(t)
	flow := idem.MustNewFlow("no.answer", []idem.Phase[rideInput]{{
		Name: "only",
		Do: func(context.Context, idem.Tx, *idem.Attempt[rideInput]) (idem.Result, error) {
			return idem.Advance(), nil
		},
	}}, nil)
	out, err := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{flow}}).Execute(context.Background(), flow, b.request("k1", rideInput{}))
	require.ErrorIs(t, err, idem.ErrPhaseFailed)
	require.ErrorContains(t, err, "must respond")
	require.Equal(t, idem.OutcomeFailed, out.Kind)
	require.Equal(t, idemtype.RecoveryPointStarted, b.key(t, "k1").RecoveryPoint)
}

// A deploy that renamed a phase strands keys whose recovery point it was:
// they fail clearly instead of running the wrong phase.
func TestUnknownRecoveryPointFailsClearly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	crashing := b.runner(t, &idem.Config{Test: idemtest.WithHook(idem.TestConfig{}, func(_ context.Context, at idemtest.HookPoint) error {
		if at.Where == idemtest.HookAfterCommit {
			return idemtest.ErrSimulatedCrash
		}
		return nil
	})})
	_, err := crashing.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)

	renamed := idem.MustNewFlow("rides.create", []idem.Phase[rideInput]{{
		Name: "ride_made",
		Do: func(context.Context, idem.Tx, *idem.Attempt[rideInput]) (idem.Result, error) {
			return idem.RespondJSON(http.StatusOK, "x"), nil
		},
	}}, nil)
	b.clock.Advance(2 * time.Minute)
	out, err := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{renamed}}).Execute(ctx, renamed, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.ErrorIs(t, err, idem.ErrUnknownRecoveryPoint)
	require.Equal(t, idem.OutcomeFailed, out.Kind)
	rec := b.key(t, "k1")
	require.Nil(t, rec.LockedAt)
	require.Contains(t, rec.LastError, "ride_created")
}

func TestFlowDeclarationIsChecked(t *testing.T) {
	t.Parallel()
	run := func(context.Context, idem.Tx, *idem.Attempt[rideInput]) (idem.Result, error) {
		return idem.Advance(), nil
	}
	for name, tc := range map[string]struct {
		flow   string
		phases []idem.Phase[rideInput]
	}{
		"bad flow name":        {"", []idem.Phase[rideInput]{{Name: "a", Do: run}}},
		"no phases":            {"f", nil},
		"bad phase name":       {"f", []idem.Phase[rideInput]{{Name: "Charge!", Do: run}}},
		"reserved name":        {"f", []idem.Phase[rideInput]{{Name: "finished", Do: run}}},
		"duplicate":            {"f", []idem.Phase[rideInput]{{Name: "a", Do: run}, {Name: "a", Do: run}}},
		"no run":               {"f", []idem.Phase[rideInput]{{Name: "a"}}},
		"not idempotent alone": {"f", []idem.Phase[rideInput]{{Name: "a", Do: run, Foreign: idem.ForeignNotIdempotent}}},
	} {
		_, err := idem.NewFlow(tc.flow, tc.phases, nil)
		require.Error(t, err, name)
	}
}

func TestConfigDefaultsAndValidation(t *testing.T) {
	t.Parallel()
	cfg := (&idem.Config{}).WithDefaults()
	require.Equal(t, 90*time.Second, cfg.Lease)
	require.Equal(t, 30*time.Second, cfg.HeartbeatInterval)
	require.Equal(t, 24*time.Hour, cfg.Retention)
	require.Equal(t, pgx.ReadCommitted, cfg.Isolation)
	require.Equal(t, 3, cfg.MaxPhaseRetries)

	b := setup(t)
	for name, bad := range map[string]*idem.Config{
		"tiny lease":         {Lease: time.Millisecond},
		"heartbeat too slow": {Lease: time.Minute, HeartbeatInterval: 2 * time.Minute},
		"bad isolation":      {Isolation: "chaos"},
		"duplicate flows":    {Flows: []idem.AnyFlow{b.flow, b.flow}},
	} {
		_, err := idem.NewRunner(b.storeFor(t), bad)
		require.Error(t, err, name)
	}
}

// Postgres stores no NUL character in jsonb or text; input holding one is
// refused before anything is written, instead of failing on every retry.
func TestInputPostgresCannotStoreIsInvalid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.runner(t, nil)
	for name, req := range map[string]idem.Request{
		"NUL in a param":      {Scope: "s", Key: "k", Params: rideInput{Origin: "S\x00F"}},
		"NUL in JSON params":  {Scope: "s", Key: "k", Params: []byte(`{"origin": "S\u0000F"}`)},
		"NUL in the scope":    {Scope: "s\x00", Key: "k", Params: rideInput{}},
		"bad UTF-8 in a path": {Scope: "s", Key: "k", Path: "/rides/\xff", Params: rideInput{}},
	} {
		out, err := r.Execute(context.Background(), b.flow, req)
		require.ErrorIs(t, err, idem.ErrInvalidRequest, name)
		require.Equal(t, idem.OutcomeInvalid, out.Kind, name)
	}
	_, err := r.Execute(context.Background(), b.flow, idem.Request{Scope: "s", Key: "k", Params: []byte(`{"origin": "S\u0000F"}`)})
	require.ErrorIs(t, err, idem.ErrInvalidParams)
	out, err := r.Execute(context.Background(), b.flow, idem.Request{Scope: "s", Key: "k", Params: rideInput{Origin: `S\u0000F`}})
	require.NoError(t, err, "an escaped backslash before u0000 is text")
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, 1, b.countRows(t, "idem_keys"))
}

// Reconcile runs over every idle needs_reconcile key: a hook that cannot
// tell leaves them for the next run, IdleFor later; verdicts carry each
// flow to its response, and each message is sent exactly once.
func TestReconcileAllResolvesIdleKeys(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	ctx := context.Background()
	r := b.runner(t, nil)
	keys := []string{"k1", "k2", "k3"}
	for _, key := range keys {
		b.gateway.lose = true // the send fails before reaching the gateway
		_, err := r.Execute(ctx, b.flow, b.req(key))
		require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	}
	cfg := &idem.ReconcileConfig{IdleFor: time.Minute, BatchSize: 2}

	res, err := r.ReconcileAll(ctx, cfg)
	require.NoError(t, err)
	require.Zero(t, res.Claimed, "just put in needs_reconcile: not idle yet")

	obs := newCountingObserver()
	observed := b.testBundle.runner(t, &idem.Config{Flows: []idem.AnyFlow{b.flow}, Observer: obs})
	b.clock.Advance(2 * time.Minute)
	b.gateway.unknown = true
	res, err = observed.ReconcileAll(ctx, cfg)
	require.NoError(t, err)
	require.Equal(t, &idem.ReconcileResult{Claimed: 3, Unresolved: 3}, res)
	require.Equal(t, 3, obs.n(idem.EventNeedsReconcile))
	require.Equal(t, 3, obs.n(idem.EventReconciled))

	res, err = observed.ReconcileAll(ctx, cfg)
	require.NoError(t, err)
	require.Zero(t, res.Claimed, "asked a minute ago: wait IdleFor before asking again")

	b.clock.Advance(2 * time.Minute)
	b.gateway.unknown = false
	res, err = observed.ReconcileAll(ctx, cfg)
	require.NoError(t, err)
	require.Equal(t, &idem.ReconcileResult{Claimed: 3, Resolved: 3}, res)
	for _, key := range keys {
		require.Equal(t, idemtype.StoredFinished, b.key(t, key).Status, key)
		require.Equal(t, 1, b.gateway.times(b.ref(t, key)), key)
	}

	// MaxKeys bounds a pass.
	for i := range 3 {
		b.gateway.lose = true
		_, err := r.Execute(ctx, b.flow, b.req(fmt.Sprint("later-", i)))
		require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	}
	b.clock.Advance(2 * time.Minute)
	res, err = r.ReconcileAll(ctx, &idem.ReconcileConfig{IdleFor: time.Minute, BatchSize: 2, MaxKeys: 1})
	require.NoError(t, err)
	require.Equal(t, &idem.ReconcileResult{Claimed: 1, Resolved: 1}, res)
}

// smsFlowWithoutHook is the SMS flow as a binary declares it that does not
// know its send is not idempotent (an operations binary built without the
// option, or a deploy that switched the phase to idempotent while keys were
// in doubt): no Reconcile hook.
func smsFlowWithoutHook() *idem.Flow[smsInput] {
	advance := func(context.Context, idem.Tx, *idem.Attempt[smsInput]) (idem.Result, error) {
		return idem.Advance(), nil
	}
	return idem.MustNewFlow("sms.send", []idem.Phase[smsInput]{
		{Name: "message_saved", Do: advance},
		{Name: "sms_sent", Do: advance},
		{Name: "responded", Do: func(context.Context, idem.Tx, *idem.Attempt[smsInput]) (idem.Result, error) {
			return idem.RespondJSON(http.StatusCreated, map[string]any{}), nil
		}},
	}, nil)
}

// parkInDoubt leaves key in needs_reconcile with the send in doubt.
func (b *smsBundle) parkInDoubt(t *testing.T, key string) {
	t.Helper()
	b.gateway.lose = true
	_, err := b.runner(t, nil).Execute(context.Background(), b.flow, b.req(key))
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	rec := b.key(t, key)
	require.Equal(t, idemtype.StoredNeedsReconcile, rec.Status)
	require.Equal(t, "sms_sent", rec.ForeignMark)
}

// A reconcile run in a binary whose phase has no reconcile hook used to call
// a nil hook (a panic as a phase failure) and moved the key's fence and
// attempts on at every try. Now it is a stable error naming the flow and
// the phase, and the key is left exactly as it was.
func TestReconcileWithoutHookIsAStableErrorAndMovesNoCounter(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	ctx := context.Background()
	b.parkInDoubt(t, "k1")
	before := b.key(t, "k1")

	r := b.testBundle.runner(t, &idem.Config{Flows: []idem.AnyFlow{smsFlowWithoutHook()}})
	for range 3 {
		out, err := r.Reconcile(ctx, "user:1", "k1")
		require.ErrorIs(t, err, idem.ErrNoReconcileHook)
		require.ErrorIs(t, err, idem.ErrNeedsReconcile)
		missing, ok := errors.AsType[*idem.NoReconcileHookError](err)
		require.True(t, ok, "%v", err)
		require.Equal(t, idem.NoReconcileHookError{Flow: "sms.send", Phase: "sms_sent"}, *missing)
		require.Equal(t, idem.OutcomeNeedsReconcile, out.Kind)
		require.NotContains(t, err.Error(), "panic")
	}
	res, err := r.ReconcileAll(ctx, &idem.ReconcileConfig{IdleFor: 1})
	require.NoError(t, err)
	require.Equal(t, 1, res.NoHook)
	require.Zero(t, res.Failed)

	after := b.key(t, "k1")
	t.Logf("fence %d -> %d, attempts %d -> %d; error: %v", before.Fence, after.Fence, before.Attempts, after.Attempts,
		&idem.NoReconcileHookError{Flow: "sms.send", Phase: "sms_sent"})
	require.Equal(t, before.Fence, after.Fence, "no fence moved")
	require.Equal(t, before.Attempts, after.Attempts, "no attempt counted")
	require.Equal(t, idemtype.StoredNeedsReconcile, after.Status)
	require.Equal(t, "sms_sent", after.ForeignMark)
	require.Equal(t, before.LastError, after.LastError)

	// The binary that has the hook still reconciles it.
	out, err := b.runner(t, nil).Reconcile(ctx, "user:1", "k1")
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
}

// CheckReconcileHooks (which the Maintainer runs at start) reports the keys
// in doubt at phases this binary has no reconcile hook for: in
// needs_reconcile, and still running with their mark standing (a crash after
// the call), which go there on their next attempt.
func TestCheckReconcileHooksReportsKeysInDoubtWithoutAHook(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	ctx := context.Background()
	b.parkInDoubt(t, "parked")
	crashing := b.runner(t, crashAt(idemtest.HookAfterForeign, "sms_sent"))
	_, err := crashing.Execute(ctx, b.flow, b.req("crashed"))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	_, err = b.runner(t, nil).Execute(ctx, b.flow, b.req("fine"))
	require.NoError(t, err)

	missing, err := b.runner(t, nil).CheckReconcileHooks(ctx)
	require.NoError(t, err)
	require.Empty(t, missing, "the binary with the hook has nothing to report")

	without := b.testBundle.runner(t, &idem.Config{Flows: []idem.AnyFlow{smsFlowWithoutHook()}})
	missing, err = without.CheckReconcileHooks(ctx)
	require.NoError(t, err)
	t.Logf("reported: %+v", missing)
	require.Equal(t, []idem.MissingHook{{Flow: "sms.send", Phase: "sms_sent", Keys: 2, NeedsReconcile: 1}}, missing)
}
