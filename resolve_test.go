package idem_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/migrations"
)

// inDoubt leaves key k in needs_reconcile with the SMS send in doubt: the
// gateway failed, so the hook would say not done, but an operator's verdict
// is what these tests give. It returns the runner.
func (b *smsBundle) inDoubt(t *testing.T, k string) *idem.Runner {
	t.Helper()
	r := b.runner(t, nil)
	b.gateway.lose = true
	_, err := r.Execute(context.Background(), b.flow, b.req(k))
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	rec := b.key(t, k)
	require.Equal(t, idemtype.StoredNeedsReconcile, rec.Status)
	require.Equal(t, "sms_sent", rec.ForeignMark)
	return r
}

// resolution is a verdict as an operator gives it, confirming (for not
// happened) that the call in doubt is made again.
func resolution(v idem.ResolveVerdict) idem.Resolution {
	return idem.Resolution{Verdict: v, Operator: "alice", Reason: "INC-42: the gateway's console shows it", ConfirmRerun: true}
}

// keyRow is the key's progress and lease rows as JSON, to compare whole.
func (b *smsBundle) keyRow(t *testing.T, k string) string {
	t.Helper()
	var row string
	require.NoError(t, b.pool.QueryRow(context.Background(), `
		SELECT row_to_json(k)::text || coalesce(row_to_json(l)::text, '')
		FROM idem_keys k LEFT JOIN idem_leases l ON l.key_id = k.id WHERE k.scope = 'user:1' AND k.key = $1`, k).Scan(&row))
	return row
}

// happened: the phase is committed in the call's stead and the key resumes
// at the next phase; the send is never repeated.
func TestResolveHappenedResumesAtTheNextPhase(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	r := b.inDoubt(t, "k1")
	ctx := context.Background()

	res, err := r.Resolve(ctx, "user:1", "k1", resolution(idem.ResolveHappened))
	require.NoError(t, err)
	t.Logf("action: %s", res.Action)
	rec := b.key(t, "k1")
	require.Equal(t, idemtype.StoredRunning, rec.Status)
	require.Equal(t, "sms_sent", rec.RecoveryPoint)
	require.Empty(t, rec.ForeignMark)
	require.Nil(t, rec.LockedAt, "released for the retry or the completer")
	require.Contains(t, rec.LastError, "alice")
	require.Contains(t, rec.LastError, "INC-42")

	out, err := r.Execute(ctx, b.flow, b.req("k1"))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, http.StatusCreated, out.Response.Status)
	require.Equal(t, 1, b.counts.Get()["sms_sent"], "the phase did not run again")
	require.Zero(t, b.counts.Get()["reconcile"])
	require.Zero(t, b.gateway.times(b.ref(t, "k1")))
}

// happened with an answer: the key is finished with it, replayed to every
// retry, and no phase runs.
func TestResolveHappenedWithAnAnswerFinishesTheKey(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	r := b.inDoubt(t, "k1")
	ctx := context.Background()

	v := resolution(idem.ResolveHappened)
	v.Response = &idemtype.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"message_id":7}`)}
	_, err := r.Resolve(ctx, "user:1", "k1", v)
	require.NoError(t, err)
	rec := b.key(t, "k1")
	require.Equal(t, idemtype.StoredFinished, rec.Status)
	require.Equal(t, idemtype.RecoveryPointFinished, rec.RecoveryPoint)
	require.Contains(t, rec.LastError, "resolved by alice: happened")

	out, err := r.Execute(ctx, b.flow, b.req("k1"))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
	require.Equal(t, http.StatusCreated, out.Response.Status)
	require.JSONEq(t, `{"message_id":7}`, string(out.Response.Body))
	require.Equal(t, 1, b.counts.Get()["sms_sent"])
}

// not happened: the mark is cleared and the key released; the retry runs
// the phase again, which sends once.
func TestResolveNotHappenedRunsThePhaseAgain(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	r := b.inDoubt(t, "k1")
	ctx := context.Background()

	_, err := r.Resolve(ctx, "user:1", "k1", resolution(idem.ResolveNotHappened))
	require.NoError(t, err)
	rec := b.key(t, "k1")
	require.Equal(t, idemtype.StoredRunning, rec.Status)
	require.Equal(t, "message_saved", rec.RecoveryPoint)
	require.Empty(t, rec.ForeignMark)
	require.Nil(t, rec.LockedAt)
	require.Contains(t, rec.LastError, "not_happened")

	out, err := r.Execute(ctx, b.flow, b.req("k1"))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, 2, b.counts.Get()["sms_sent"])
	require.Equal(t, 1, b.gateway.times(b.ref(t, "k1")))
}

// abandon: the key is finished as abandoned; every retry gets
// ErrRequestAbandoned and nothing runs; the completer and reconcile leave it.
func TestResolveAbandonFinishesTheKeyForGood(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	r := b.inDoubt(t, "k1")
	ctx := context.Background()

	res, err := r.Resolve(ctx, "user:1", "k1", resolution(idem.ResolveAbandon))
	require.NoError(t, err)
	t.Logf("action: %s; key: status %s, recovery point %s, last error %q", res.Action, res.Record.Status, res.Record.RecoveryPoint, res.Record.LastError)
	rec := b.key(t, "k1")
	require.Equal(t, idemtype.StoredFinished, rec.Status)
	require.Equal(t, idemtype.RecoveryPointAbandoned, rec.RecoveryPoint)
	require.Equal(t, idem.AbandonedStatus, rec.ResponseStatus)
	require.Contains(t, rec.LastError, "resolved by alice: abandon: INC-42")

	for range 2 {
		out, err := r.Execute(ctx, b.flow, b.req("k1"))
		require.ErrorIs(t, err, idem.ErrRequestAbandoned)
		require.Equal(t, idem.OutcomeRequestAbandoned, out.Kind)
		require.Nil(t, out.Response)
	}
	cres, err := r.Complete(ctx, &idem.CompleteConfig{IdleFor: time.Microsecond})
	require.NoError(t, err)
	require.Zero(t, cres.Claimed)
	_, err = r.Reconcile(ctx, "user:1", "k1")
	require.ErrorIs(t, err, idem.ErrNothingToReconcile)
	require.Equal(t, 1, b.counts.Get()["sms_sent"])
	require.Zero(t, b.gateway.times(b.ref(t, "k1")))
}

// Keys in other states are refused, unchanged; so are bad resolutions.
func TestResolveRefusesOtherStates(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	r := b.runner(t, nil)
	ctx := context.Background()
	_, err := r.Execute(ctx, b.flow, b.req("done"))
	require.NoError(t, err)
	before := b.keyRow(t, "done")
	for _, v := range []idem.ResolveVerdict{idem.ResolveHappened, idem.ResolveNotHappened, idem.ResolveAbandon} {
		_, err = r.Resolve(ctx, "user:1", "done", resolution(v))
		require.ErrorIs(t, err, idem.ErrNothingToReconcile, v)
		t.Logf("%s on a finished key: %v", v, err)
	}
	require.Equal(t, before, b.keyRow(t, "done"))

	// A running key: its worker died before the send.
	crashing := b.runner(t, func(_ context.Context, at idemtest.HookPoint) error {
		if at.Where == idemtest.HookPhaseStart && at.Phase == "sms_sent" {
			return idemtest.ErrSimulatedCrash
		}
		return nil
	})
	_, err = crashing.Execute(ctx, b.flow, b.req("running"))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	before = b.keyRow(t, "running")
	_, err = r.Resolve(ctx, "user:1", "running", resolution(idem.ResolveAbandon))
	require.ErrorIs(t, err, idem.ErrNothingToReconcile)
	require.Contains(t, err.Error(), "is running")
	require.Equal(t, before, b.keyRow(t, "running"))

	_, err = r.Resolve(ctx, "user:1", "nope", resolution(idem.ResolveAbandon))
	require.ErrorIs(t, err, idem.ErrNotFound)

	r = b.inDoubt(t, "k1")
	before = b.keyRow(t, "k1")
	for name, v := range map[string]idem.Resolution{
		"no operator":            {Verdict: idem.ResolveAbandon, Reason: "x"},
		"no reason":              {Verdict: idem.ResolveAbandon, Operator: "alice"},
		"unknown verdict":        {Verdict: "maybe", Operator: "alice", Reason: "x"},
		"answer with abandon":    {Verdict: idem.ResolveAbandon, Operator: "alice", Reason: "x", Response: &idemtype.Response{Status: 200}},
		"answer with bad status": {Verdict: idem.ResolveHappened, Operator: "alice", Reason: "x", Response: &idemtype.Response{Status: 99}},
		"a one-word reason":      {Verdict: idem.ResolveAbandon, Operator: "alice", Reason: "INC-4242424242"},
		"a short reason":         {Verdict: idem.ResolveAbandon, Operator: "alice", Reason: "a b c d"},
		"a one-character reason": {Verdict: idem.ResolveAbandon, Operator: "x", Reason: "x"},
	} {
		_, err := r.Resolve(ctx, "user:1", "k1", v)
		require.ErrorIs(t, err, idem.ErrInvalidRequest, name)
	}
	require.Equal(t, before, b.keyRow(t, "k1"))
}

// A runner that does not have the key's flow resolves every verdict but
// "happened, resume", which needs to know the phase is not the last.
func TestResolveWithoutTheFlow(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	b.inDoubt(t, "k1")
	ctx := context.Background()
	bare := b.testBundle.runner(t, &idem.Config{Flows: []idem.AnyFlow{b.testBundle.flow}}) // the rides flow only
	before := b.keyRow(t, "k1")
	_, err := bare.Resolve(ctx, "user:1", "k1", resolution(idem.ResolveHappened))
	require.ErrorIs(t, err, idem.ErrUnknownFlow)
	t.Logf("happened without the flow: %v", err)
	require.Equal(t, before, b.keyRow(t, "k1"))

	_, err = bare.Resolve(ctx, "user:1", "k1", resolution(idem.ResolveNotHappened))
	require.NoError(t, err)
	require.Equal(t, "message_saved", b.key(t, "k1").RecoveryPoint)
	out, err := b.runner(t, nil).Execute(ctx, b.flow, b.req("k1"))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
}

// A dry run says what it would do and changes nothing, for every verdict.
func TestResolveDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	r := b.inDoubt(t, "k1")
	ctx := context.Background()
	before := b.keyRow(t, "k1")
	for _, v := range []idem.ResolveVerdict{idem.ResolveHappened, idem.ResolveNotHappened, idem.ResolveAbandon} {
		res := resolution(v)
		res.DryRun = true
		out, err := r.Resolve(ctx, "user:1", "k1", res)
		require.NoError(t, err)
		require.True(t, out.DryRun)
		require.Contains(t, out.Action, "would ")
		t.Logf("%s: %s", v, out.Action)
		require.Equal(t, before, b.keyRow(t, "k1"))
	}
}

// The fence: a resolve refuses a key another claim holds; once that claim's
// lease lapses, the resolve takes the key and the old holder can no longer
// commit.
func TestResolveIsFencedAgainstAConcurrentClaim(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	r := b.inDoubt(t, "k1")
	ctx := context.Background()
	store := b.storeFor(t)
	now := b.clock.Now()
	held, err := store.ClaimReconcile(ctx, idemdriver.ClaimParams{Scope: "user:1", Key: "k1", Lease: time.Minute, Now: &now})
	require.NoError(t, err)
	require.NotEqual(t, idemdriver.AcquiredNone, held.Acquired)
	before := b.keyRow(t, "k1")

	dry := resolution(idem.ResolveAbandon)
	dry.DryRun = true
	plan, err := r.Resolve(ctx, "user:1", "k1", dry)
	require.NoError(t, err)
	t.Logf("dry run while claimed: %s", plan.Action)
	require.Contains(t, plan.Action, "the key is held until")

	_, err = r.Resolve(ctx, "user:1", "k1", resolution(idem.ResolveAbandon))
	require.ErrorIs(t, err, idem.ErrInProgress)
	t.Logf("while claimed: %v", err)
	require.Equal(t, before, b.keyRow(t, "k1"), "refused, unchanged")

	b.clock.Advance(2 * time.Minute) // the holder's lease lapses
	res, err := r.Resolve(ctx, "user:1", "k1", resolution(idem.ResolveNotHappened))
	require.NoError(t, err)
	require.Greater(t, res.Record.Fence, held.Record.Fence)

	tx, err := store.BeginPhase(ctx, idemdriver.PhaseOptions{})
	require.NoError(t, err)
	err = tx.CommitPhase(ctx, idemdriver.CommitParams{Ref: idemdriver.LockRef{ID: held.Record.ID, Fence: held.Record.Fence, Scope: held.Record.Scope},
		RecoveryPoint: "sms_sent", Status: idemtype.StoredRunning})
	require.ErrorIs(t, err, idem.ErrLockLost, "the old holder is fenced off")
	require.Equal(t, "message_saved", b.key(t, "k1").RecoveryPoint)
}

// Resolves racing on one key: exactly one verdict lands; the others are
// refused (held, or no longer in needs_reconcile) and change nothing.
func TestResolveRaceOneVerdictWins(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	r := b.inDoubt(t, "k1")
	ctx := context.Background()
	verdicts := []idem.ResolveVerdict{idem.ResolveHappened, idem.ResolveNotHappened, idem.ResolveAbandon, idem.ResolveAbandon}
	errs := make([]error, len(verdicts))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, v := range verdicts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = r.Resolve(ctx, "user:1", "k1", resolution(v))
		}()
	}
	close(start)
	wg.Wait()
	won := -1
	for i, err := range errs {
		if err == nil {
			require.Equal(t, -1, won, "two verdicts landed, the second %v", verdicts[i])
			won = i
			continue
		}
		require.True(t, errors.Is(err, idem.ErrInProgress) || errors.Is(err, idem.ErrNothingToReconcile), "%s: %v", verdicts[i], err)
	}
	require.GreaterOrEqual(t, won, 0, "no verdict landed: %v", errs)
	rec := b.key(t, "k1")
	t.Logf("winner %s: key %s at %s; others: %v", verdicts[won], rec.Status, rec.RecoveryPoint, errs)
	require.Contains(t, rec.LastError, string(verdicts[won]))
	require.Nil(t, rec.LockedAt)
}

// Finding 1 of the security review: an operator's verdict that the call in
// doubt did not happen, when it did, makes it twice. Without ConfirmRerun
// it is refused, saying so, the key unchanged. Confirmed, it is recorded,
// in its own transaction, with who gave it, why, from where, on which fence
// and phase; the record survives the finish that clears last_error and the
// reaper that deletes the key; a metric counts it.
func TestResolveNotHappenedNeedsConfirmingAndIsRecordedForGood(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	obs := newCountingObserver()
	var verdictSeen string
	obs.onEvent = func(e idem.Event) {
		if e.Kind == idem.EventResolved {
			verdictSeen = e.Verdict
		}
	}
	r := b.testBundle.runner(t, &idem.Config{Flows: []idem.AnyFlow{b.flow}, Observer: obs, Retention: time.Hour})
	ctx := context.Background()
	// The send went through; its answer was lost with the worker, and the
	// gateway cannot be asked.
	b.crashAfterSend(t, "k1")
	b.gateway.unknown = true
	b.clock.Advance(2 * time.Minute) // the dead worker's lease lapses
	_, err := r.Execute(ctx, b.flow, b.req("k1"))
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	require.Equal(t, 1, b.gateway.times(b.ref(t, "k1")))
	before := b.keyRow(t, "k1")

	unconfirmed := resolution(idem.ResolveNotHappened)
	unconfirmed.ConfirmRerun = false
	out, err := r.Resolve(ctx, "user:1", "k1", unconfirmed)
	t.Logf("unconfirmed: %v", err)
	require.ErrorIs(t, err, idem.ErrRerunNotConfirmed)
	require.Contains(t, err.Error(), `the call of phase "sms_sent" will be made again; if it did happen, it happens twice`)
	require.Contains(t, out.Action, "will be made again")
	require.Equal(t, before, b.keyRow(t, "k1"), "refused, unchanged")
	verdicts, err := r.Verdicts(ctx, "user:1", "k1")
	require.NoError(t, err)
	require.Empty(t, verdicts, "a refused verdict leaves no record")

	confirmed := resolution(idem.ResolveNotHappened)
	res, err := r.Resolve(ctx, "user:1", "k1", confirmed)
	require.NoError(t, err)
	t.Logf("confirmed: %s", res.Action)
	require.Equal(t, 1, obs.n(idem.EventResolved))
	require.Equal(t, "not_happened", verdictSeen)

	// The operator was wrong: the retry sends a second time, and finishes
	// the key, which clears its last error.
	b.gateway.unknown = false
	_, err = r.Execute(ctx, b.flow, b.req("k1"))
	require.NoError(t, err)
	require.Equal(t, 2, b.gateway.times(b.ref(t, "k1")))
	rec := b.key(t, "k1")
	require.Equal(t, idemtype.StoredFinished, rec.Status)
	require.Empty(t, rec.LastError)

	var sessionUser string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT session_user`).Scan(&sessionUser))
	check := func(when string) {
		t.Helper()
		verdicts, err := r.Verdicts(ctx, "user:1", "k1")
		require.NoError(t, err)
		require.Len(t, verdicts, 1, when)
		v := verdicts[0]
		t.Logf("%s: %+v", when, v)
		require.Equal(t, "not_happened", v.Verdict)
		require.Equal(t, "sms_sent", v.Phase)
		require.Equal(t, "not_idempotent", v.ForeignKind)
		require.Equal(t, "alice", v.Operator)
		require.Equal(t, confirmed.Reason, v.Reason)
		require.Equal(t, sessionUser, v.SessionUser)
		require.Equal(t, rec.ID, v.KeyID)
		require.Equal(t, res.Record.Fence, v.Fence, "the fence the verdict held the key with")
		require.Equal(t, "sms.send", v.Flow)
		require.Contains(t, v.Action, "will be made again")
		require.Nil(t, v.AnswerStatus)
		require.False(t, v.CreatedAt.IsZero())
	}
	check("after the finish")

	b.clock.Advance(2 * time.Hour)
	reaped, err := r.Reap(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 1, reaped.Deleted)
	_, _, err = r.GetKey(ctx, "user:1", "k1")
	require.ErrorIs(t, err, idem.ErrNotFound)
	check("after the reaper")

	// Reverting the migration that holds them refuses while any is kept.
	m, err := migrations.New(b.pool, &migrations.Config{Schema: b.schema.Name})
	require.NoError(t, err)
	_, err = m.Down(ctx, migrations.Latest()-1)
	require.ErrorIs(t, err, migrations.ErrRefused)
	check("after a refused revert")
}

// A verdict with an answer records the answer's status and size (not its
// body); a verdict whose commit does not land (the key's fence moved on)
// records nothing.
func TestResolveRecordsTheAnswerAndOnlyVerdictsThatLand(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	r := b.inDoubt(t, "k1")
	ctx := context.Background()
	v := resolution(idem.ResolveHappened)
	v.Response = &idemtype.Response{Status: http.StatusCreated, Body: []byte(`{"message_id":7}`)}
	_, err := r.Resolve(ctx, "user:1", "k1", v)
	require.NoError(t, err)
	verdicts, err := r.Verdicts(ctx, "user:1", "k1")
	require.NoError(t, err)
	require.Len(t, verdicts, 1)
	require.Equal(t, http.StatusCreated, *verdicts[0].AnswerStatus)
	require.Equal(t, len(`{"message_id":7}`), *verdicts[0].AnswerBytes)

	// The record goes with the commit: a transaction whose fenced commit
	// fails rolls it back.
	store := b.storeFor(t)
	rec := b.key(t, "k1")
	tx, err := store.BeginPhase(ctx, idemdriver.PhaseOptions{})
	require.NoError(t, err)
	lost := &idemtype.Verdict{Scope: "user:1", Key: "k1", KeyID: rec.ID, Fence: rec.Fence - 1, Flow: rec.Flow, Verdict: "abandon",
		RecoveryPoint: rec.RecoveryPoint, Operator: "bob", Reason: "a verdict that will not land", Action: "none"}
	require.NoError(t, store.RecordVerdict(ctx, tx, lost))
	err = tx.CommitPhase(ctx, idemdriver.CommitParams{Ref: idemdriver.LockRef{ID: rec.ID, Fence: rec.Fence - 1, Scope: "user:1"},
		RecoveryPoint: "sms_sent", Status: idemtype.StoredRunning})
	require.ErrorIs(t, err, idem.ErrLockLost)
	verdicts, err = r.Verdicts(ctx, "user:1", "k1")
	require.NoError(t, err)
	require.Len(t, verdicts, 1, "the verdict that did not land left no record")
}

// The verdict's record lands if and only if the verdict does, and with it
// the withdrawal of the mark: a verdict whose record cannot be written
// (here a trigger refuses it) changes nothing of the key. Above all not
// happened keeps the call in doubt: its mark stays, so nothing resumes the
// key (and re-runs the call) without another confirmed verdict.
func TestResolveVerdictThatCannotBeRecordedKeepsTheCallInDoubt(t *testing.T) {
	t.Parallel()
	b := setupSMS(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `
		CREATE FUNCTION refuse_verdict() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN RAISE EXCEPTION 'the verdicts table refuses the row'; END $$;
		CREATE TRIGGER refuse_verdict BEFORE INSERT ON idem_verdicts FOR EACH ROW EXECUTE FUNCTION refuse_verdict()`)
	require.NoError(t, err)
	answered := resolution(idem.ResolveHappened)
	answered.Response = &idemtype.Response{Status: http.StatusCreated, Body: []byte(`{"message_id":7}`)}
	for k, v := range map[string]idem.Resolution{
		"not-happened": resolution(idem.ResolveNotHappened),
		"happened":     resolution(idem.ResolveHappened),
		"answered":     answered,
		"abandon":      resolution(idem.ResolveAbandon),
	} {
		r := b.inDoubt(t, k)
		_, err := r.Resolve(ctx, "user:1", k, v)
		require.ErrorContains(t, err, "the verdicts table refuses the row", k)
		rec := b.key(t, k)
		require.Equal(t, idemtype.StoredNeedsReconcile, rec.Status, k)
		require.Equal(t, "sms_sent", rec.ForeignMark, "%s: the call is still in doubt", k)
		require.Equal(t, "message_saved", rec.RecoveryPoint, k)
		require.Nil(t, rec.LockedAt, k)
	}
	_, err = b.pool.Exec(ctx, `DROP TRIGGER refuse_verdict ON idem_verdicts`)
	require.NoError(t, err)

	r := b.runner(t, nil)
	verdicts, err := r.Verdicts(ctx, "user:1", "not-happened")
	require.NoError(t, err)
	require.Empty(t, verdicts)
	unconfirmed := resolution(idem.ResolveNotHappened)
	unconfirmed.ConfirmRerun = false
	_, err = r.Resolve(ctx, "user:1", "not-happened", unconfirmed)
	require.ErrorIs(t, err, idem.ErrRerunNotConfirmed, "the re-run still needs confirming")
	dry := resolution(idem.ResolveHappened)
	dry.DryRun = true
	out, err := r.Resolve(ctx, "user:1", "not-happened", dry)
	require.NoError(t, err)
	require.Contains(t, out.Action, `commit phase "sms_sent" as done`, "a later happened commits the phase, not re-runs it")
}

// On Citus idem_verdicts is distributed by scope next to idem_keys: the
// verdict's record is inserted in the transaction of the key's commit, on
// the key's worker, and reads back.
func TestResolveRecordsTheVerdictOnCitus(t *testing.T) {
	t.Parallel()
	b := setupCitus(t)
	ctx := context.Background()
	crashing := b.runner(t, &idem.Config{Test: idemtest.WithHook(idem.TestConfig{}, crashAt(idemtest.HookPhaseStart, "charge_created"))})
	_, err := crashing.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 5}))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	b.clock.Advance(2 * time.Minute)
	_, err = b.pool.Exec(ctx, `UPDATE idem_keys SET status = 'needs_reconcile' WHERE scope = 'user:1' AND key = 'k1'`)
	require.NoError(t, err)

	r := b.runner(t, nil)
	_, err = r.Resolve(ctx, "user:1", "k1", resolution(idem.ResolveAbandon))
	require.NoError(t, err)
	verdicts, err := r.Verdicts(ctx, "user:1", "k1")
	require.NoError(t, err)
	require.Len(t, verdicts, 1)
	require.Equal(t, "abandon", verdicts[0].Verdict)
	_, err = r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 5}))
	require.ErrorIs(t, err, idem.ErrRequestAbandoned)
}
