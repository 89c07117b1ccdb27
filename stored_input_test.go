package idem_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
)

type cardInput struct {
	Card   string `json:"card"`
	Amount int    `json:"amount"`
}

// cardFlow charges a card in its second phase; its phases record the card
// each saw, and the first can be made to crash.
type cardFlow struct {
	flow *idem.Flow[cardInput]
	mu   sync.Mutex
	seen []string
}

func (c *cardFlow) saw() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.seen...)
}

func newCardFlow(name string, cfg *idem.FlowConfig[cardInput]) *cardFlow {
	c := &cardFlow{}
	record := func(run *idem.Attempt[cardInput]) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.seen = append(c.seen, run.Input().Card)
	}
	c.flow = idem.MustNewFlow(name, []idem.Phase[cardInput]{
		{Name: "reserved", Do: func(_ context.Context, _ idem.Tx, run *idem.Attempt[cardInput]) (idem.Result, error) {
			record(run)
			return idem.Advance(), nil
		}},
		{Name: "charged", Do: func(_ context.Context, _ idem.Tx, run *idem.Attempt[cardInput]) (idem.Result, error) {
			record(run)
			return idem.RespondJSON(http.StatusCreated, map[string]int{"amount": run.Input().Amount}), nil
		}},
	}, cfg)
	return c
}

// withoutCard is the flow's stored projection: everything but the card.
func withoutCard(in cardInput) cardInput {
	in.Card = ""
	return in
}

const testCard = "4111111111111111"

// FlowConfig.Store says what of the input is stored with the key: the card
// never reaches the table, while the fingerprint still covers the whole
// input, so a retry with another card is a mismatch.
func TestStoreKeepsAFieldOutOfStorage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := newCardFlow("cards.charge", &idem.FlowConfig[cardInput]{Store: withoutCard})
	r := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{c.flow}})
	req := idem.Request{Scope: "user:1", Key: "k1", Params: cardInput{Card: testCard, Amount: 5}}
	out, err := r.Execute(ctx, c.flow, req)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, []string{testCard, testCard}, c.saw(), "the phases of the client's request see all of it")

	var raw string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT params::text FROM idem_keys`).Scan(&raw))
	require.JSONEq(t, `{"card": "", "amount": 5}`, raw)
	require.NotContains(t, raw, testCard)
	require.NotContains(t, string(out.Record.Params), testCard)

	out, err = r.Execute(ctx, c.flow, req)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
	_, err = r.Execute(ctx, c.flow, idem.Request{Scope: "user:1", Key: "k1", Params: cardInput{Card: "5555555555554444", Amount: 5}})
	require.ErrorIs(t, err, idem.ErrMismatch, "the fingerprint covers the card")

	// The stored projection must still be an In: a projection of a pointer
	// input that returns nil is refused before anything is written.
	nilStore := idem.MustNewFlow("cards.nil", []idem.Phase[*cardInput]{{Name: "charged",
		Do: func(context.Context, idem.Tx, *idem.Attempt[*cardInput]) (idem.Result, error) {
			return idem.RespondJSON(201, "ok"), nil
		}}},
		&idem.FlowConfig[*cardInput]{Store: func(*cardInput) *cardInput { return nil }})
	_, err = r.Execute(ctx, nilStore, idem.Request{Scope: "user:1", Key: "k2", Params: &cardInput{Card: testCard}})
	require.ErrorIs(t, err, idem.ErrInvalidParams)
	require.Equal(t, 1, b.countRows(t, "idem_keys"))
}

// The completer resumes an abandoned request from what was stored: a flow
// whose stored input can re-drive it is completed with that (its phases see
// the projection); a flow that says it cannot (NoRedrive) is never claimed,
// and waits for its client's retry, which brings the whole input.
func TestCompleterRedrivesOnlyFromWhatWasStored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	redrives := newCardFlow("cards.redrive", &idem.FlowConfig[cardInput]{Store: withoutCard})
	waits := newCardFlow("cards.wait", &idem.FlowConfig[cardInput]{Store: withoutCard, NoRedrive: true})
	flows := []idem.AnyFlow{redrives.flow, waits.flow}
	crash := b.runner(t, &idem.Config{Flows: flows, Test: idemtest.WithHook(idem.TestConfig{}, crashAt(idemtest.HookPhaseStart, "charged"))})
	for _, c := range []*cardFlow{redrives, waits} {
		_, err := crash.Execute(ctx, c.flow, idem.Request{Scope: "user:1", Key: c.flow.Name(), Params: cardInput{Card: testCard, Amount: 5}})
		require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	}
	b.clock.Advance(time.Hour)

	r := b.runner(t, &idem.Config{Flows: flows})
	res, err := r.Complete(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, &idem.CompleteResult{Claimed: 1, Completed: 1}, res)
	require.Equal(t, []string{testCard, ""}, redrives.saw(), "resumed from the stored projection")
	require.Equal(t, idemtype.StoredFinished, b.key(t, "cards.redrive").Status)
	require.Equal(t, idemtype.StoredRunning, b.key(t, "cards.wait").Status, "not claimed")

	out, err := r.Execute(ctx, waits.flow, idem.Request{Scope: "user:1", Key: "cards.wait", Params: cardInput{Card: testCard, Amount: 5}})
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.True(t, out.TookOver)
	require.Equal(t, []string{testCard, testCard}, waits.saw(), "the client's retry brought the card")
}

// A reconcile run settles the phase in doubt of a flow that cannot re-drive
// from its stored input, then hands the key back to its client instead of
// running later phases with what was stored.
func TestReconcileHandsANoRedriveKeyBackToItsClient(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var mu sync.Mutex
	var seen []string
	saw := func(run *idem.Attempt[cardInput]) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, run.Input().Card)
	}
	flow := idem.MustNewFlow("cards.charge", []idem.Phase[cardInput]{
		{
			Name: "charged", Foreign: idem.ForeignNotIdempotent,
			Do: func(ctx context.Context, _ idem.Tx, run *idem.Attempt[cardInput]) (idem.Result, error) {
				saw(run)
				return idem.Advance(), run.Foreign(ctx, "charge", func(context.Context, string) error { return nil })
			},
			Reconcile: func(_ context.Context, _ idem.Tx, run *idem.Attempt[cardInput]) (idem.ReconcileVerdict, error) {
				saw(run)
				return idem.ReconcileHappened(idem.Advance()), nil
			},
		},
		{Name: "receipted", Do: func(_ context.Context, _ idem.Tx, run *idem.Attempt[cardInput]) (idem.Result, error) {
			saw(run)
			return idem.RespondJSON(http.StatusCreated, "ok"), nil
		}},
	}, &idem.FlowConfig[cardInput]{Store: withoutCard, NoRedrive: true})
	cfg := func(hook func(context.Context, idemtest.HookPoint) error) *idem.Config {
		return &idem.Config{Flows: []idem.AnyFlow{flow}, Test: idemtest.WithHook(idem.TestConfig{}, hook)}
	}
	req := idem.Request{Scope: "user:1", Key: "k1", Params: cardInput{Card: testCard, Amount: 5}}
	_, err := b.runner(t, cfg(crashAt(idemtest.HookAfterForeign, "charged"))).Execute(ctx, flow, req)
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	b.clock.Advance(time.Hour)
	r := b.runner(t, cfg(nil))
	_, err = r.Execute(ctx, flow, req)
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	b.clock.Advance(time.Minute)

	res, err := r.ReconcileAll(ctx, &idem.ReconcileConfig{IdleFor: time.Second})
	require.NoError(t, err)
	require.Equal(t, &idem.ReconcileResult{Claimed: 1, Resolved: 1}, res)
	rec := b.key(t, "k1")
	require.Equal(t, idemtype.StoredRunning, rec.Status)
	require.Equal(t, "charged", rec.RecoveryPoint, "the verdict committed the phase in doubt")
	require.Nil(t, rec.LockedAt)
	require.Contains(t, rec.LastError, "client's retry")
	require.Equal(t, []string{testCard, ""}, seen, "the hook saw the stored input; no later phase ran")

	out, err := r.Execute(ctx, flow, req)
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, []string{testCard, "", testCard}, seen)
}
