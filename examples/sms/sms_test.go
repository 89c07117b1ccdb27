package sms_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/examples/sms"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/pgstore"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type bundle struct {
	pool    *pgxpool.Pool
	schema  string
	url     string // the schema's URL: search_path set to it
	store   *pgstore.Store
	gateway *sms.FakeGateway
	sender  *sms.Sender
	clock   *idemtest.Clock
}

func setup(t *testing.T) *bundle {
	t.Helper()
	ctx := context.Background()
	schema := pgtest.NewSchema(t)
	require.NoError(t, sms.Migrate(ctx, schema.Pool, schema.Name))
	store, err := pgstore.New(schema.Pool, &pgstore.Config{Schema: schema.Name})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	gateway := &sms.FakeGateway{}
	sender, err := sms.NewSender(gateway, schema.Name)
	require.NoError(t, err)
	return &bundle{pool: schema.Pool, schema: schema.Name, url: schema.URL, store: store, gateway: gateway, sender: sender,
		clock: idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))}
}

var hello = sms.Params{To: "+15550100", Text: "Your pilot is on their way"}

// runner is a new process's runner, on the bundle's clock.
func (b *bundle) runner(t *testing.T, hook func(context.Context, idemtest.HookPoint) error) *idem.Runner {
	t.Helper()
	r, err := idem.NewRunner(b.store, &idem.Config{
		Flows:  []idem.AnyFlow{b.sender.Flow()},
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
		Test:   idemtest.WithHook(idem.TestConfig{Now: b.clock.Now}, hook),
	})
	require.NoError(t, err)
	return r
}

func (b *bundle) request(key string) idem.Request {
	return idem.Request{Scope: "user:1", Key: key, Path: "/messages", Params: hello}
}

// message is the row a key's request created.
type message struct {
	ID        int64
	Status    string
	GatewayID *string
}

func (b *bundle) messageOf(ctx context.Context, keyID int64) (*message, error) {
	var m message
	err := b.pool.QueryRow(ctx, `SELECT id, status, gateway_id FROM `+b.schema+`.sms_messages WHERE idempotency_key_id = $1`, keyID).
		Scan(&m.ID, &m.Status, &m.GatewayID)
	return &m, err
}

// sentOnce is the business invariant: the key's message row is marked sent
// with the id of the one and only message the gateway sent under its
// reference.
func (b *bundle) sentOnce(ctx context.Context, key *idemtype.KeyRecord) error {
	m, err := b.messageOf(ctx, key.ID)
	if err != nil {
		return fmt.Errorf("the key's message row: %w", err)
	}
	sent, err := b.gateway.Lookup(ctx, sms.Reference(m.ID))
	if err != nil {
		return err
	}
	switch {
	case len(sent) != 1:
		return fmt.Errorf("the gateway sent %d messages for message %d, want exactly one", len(sent), m.ID)
	case m.Status != "sent" || m.GatewayID == nil || *m.GatewayID != sent[0].ID:
		return fmt.Errorf("message %d is %s with gateway id %v, want sent as %s", m.ID, m.Status, m.GatewayID, sent[0].ID)
	}
	return nil
}

// The kit explores every crash point of the flow. Every crash after the
// send attempt sends the key to reconciliation; the hook finds the message
// and the flow finishes, with exactly one message sent.
func TestExploreEveryCrashPoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rep := idemtest.Explore(t, idemtest.Config[sms.Params]{
		Pool: b.pool, Schema: b.schema, DatabaseURL: b.url,
		Flow: b.sender.Flow(), Input: hello,
		Compare: idemtest.EqualJSON("message_id", "gateway_id"),
		Check:   b.sentOnce,
	})
	require.Len(t, rep.Scenarios, 3*5+1+2*rep.RoundTrips)
	require.Equal(t, []string{sms.PhaseSent}, rep.ForeignPhases)

	for _, name := range []string{"crash_before_commit@sent", "crash_after_foreign@sent", "serialization_failure@sent", "lease_takeover@sent"} {
		steps := strings.Join(scenario(t, rep, name).Steps, "\n")
		require.Contains(t, steps, `made the not-idempotent call "send_sms" of sent`, name)
		require.Contains(t, steps, "-> needs_reconcile", name)
		require.Contains(t, steps, "reconcile verdict for sent: happened", name)
	}
	// Committed sends never go to reconciliation.
	for _, name := range []string{"crash_after_commit@sent", "lost_commit_ack@sent"} {
		require.NotContains(t, strings.Join(scenario(t, rep, name).Steps, "\n"), "needs_reconcile", name)
	}
	// Through the proxy: a mark written whose reply never came stops the
	// send, and the key reconciles to not happened; a send whose commit
	// reply never came reconciles to happened, or is found committed.
	var notHappened, happened int
	for _, s := range rep.Scenarios {
		steps := strings.Join(s.Steps, "\n")
		if !s.Kind.Wire() {
			continue
		}
		if strings.Contains(steps, "reconcile verdict for sent: not happened") {
			notHappened++
		}
		if strings.Contains(steps, "reconcile verdict for sent: happened") {
			happened++
		}
	}
	require.Positive(t, notHappened, "wire scenarios reconciled to not happened")
	t.Logf("wire scenarios reconciled: %d happened, %d not happened", happened, notHappened)
	require.Len(t, b.gateway.Sent(), 2+len(rep.Scenarios), "one message per request (both baselines included), whatever happened")
}

// A number the gateway refuses: the refusal is a stored 422. A crash right
// after the refused call leaves the outcome in doubt; the reconcile hook
// finds nothing sent, says not done, and the phase runs again.
func TestExploreARejectedNumber(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.gateway.Reject(hello.To, "the number cannot receive text messages")
	rep := idemtest.Explore(t, idemtest.Config[sms.Params]{
		Pool: b.pool, Schema: b.schema, DatabaseURL: b.url,
		Flow: b.sender.Flow(), Input: hello,
		Check: func(ctx context.Context, key *idemtype.KeyRecord) error {
			m, err := b.messageOf(ctx, key.ID)
			if err == nil && m.Status != "rejected" {
				err = fmt.Errorf("message %d is %s, want rejected", m.ID, m.Status)
			}
			return err
		},
	})
	require.Equal(t, []string{sms.PhaseResponded}, rep.Unreached)
	require.Len(t, rep.Scenarios, 2*5+1+2*rep.RoundTrips)
	steps := strings.Join(scenario(t, rep, "crash_after_foreign@sent").Steps, "\n")
	require.Contains(t, steps, "reconcile verdict for sent: not happened, so the phase runs again")
	require.Contains(t, steps, "final response: 422")
	require.Empty(t, b.gateway.Sent())
}

// An invalid number is refused before anything is written or sent.
func TestExploreAnInvalidNumber(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rep := idemtest.Explore(t, idemtest.Config[sms.Params]{
		Pool: b.pool, Schema: b.schema,
		Flow: b.sender.Flow(), Input: sms.Params{To: "555-0100", Text: "hi"},
	})
	require.Equal(t, []string{sms.PhaseSent, sms.PhaseResponded}, rep.Unreached)
	require.Len(t, rep.Scenarios, 5)
	require.Empty(t, b.gateway.Sent())
}

// The needs_reconcile path step by step: the worker dies right after the
// gateway accepted the message. Every retry is answered "needs reconcile"
// and sends nothing; the reconcile run finds the message, records it and
// finishes the request; retries then replay the response.
func TestACrashAfterSendingNeedsReconcileAndIsNeverResent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	crashing := b.runner(t, func(_ context.Context, at idemtest.HookPoint) error {
		if at.Where == idemtest.HookAfterForeign {
			return idemtest.ErrSimulatedCrash
		}
		return nil
	})
	out, err := crashing.Execute(ctx, b.sender.Flow(), b.request("k1"))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	require.Len(t, b.gateway.Sent(), 1)

	b.clock.Advance(2 * time.Minute) // the dead worker's lease runs out
	for range 3 {
		out, err = b.runner(t, nil).Execute(ctx, b.sender.Flow(), b.request("k1"))
		require.ErrorIs(t, err, idem.ErrNeedsReconcile)
		require.Equal(t, idem.OutcomeNeedsReconcile, out.Kind)
	}
	require.Len(t, b.gateway.Sent(), 1, "never re-sent blindly")
	rec, err := b.store.GetKey(ctx, "user:1", "k1")
	require.NoError(t, err)
	require.Equal(t, idemtype.StoredNeedsReconcile, rec.Status)
	require.Equal(t, sms.PhaseSent, rec.ForeignMark)

	out, err = b.runner(t, nil).Reconcile(ctx, "user:1", "k1")
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, http.StatusCreated, out.Response.Status)
	var resp sms.Response
	require.NoError(t, json.Unmarshal(out.Response.Body, &resp))
	require.Equal(t, b.gateway.Sent()[0].ID, resp.GatewayID)

	replay, err := b.runner(t, nil).Execute(ctx, b.sender.Flow(), b.request("k1"))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, replay.Kind)
	require.Equal(t, out.Response.Body, replay.Response.Body)
	require.NoError(t, b.sentOnce(ctx, replay.Record))
}

// Each reconcile verdict, from a gateway fault that leaves the send in
// doubt. The phase's error after the recorded attempt sends the key to
// needs_reconcile at once, without a crash.
func TestReconcileVerdicts(t *testing.T) {
	t.Parallel()

	t.Run("done: the answer was lost, the message went out", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := context.Background()
		b.gateway.LoseNextAnswer()
		b.requireNeedsReconcile(t, "k1")
		require.Len(t, b.gateway.Sent(), 1)

		out, err := b.runner(t, nil).Reconcile(ctx, "user:1", "k1")
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, out.Response.Status)
		require.Len(t, b.gateway.Sent(), 1, "recorded, not sent again")
		require.NoError(t, b.sentOnce(ctx, out.Record))
	})

	t.Run("not happened: the request never arrived, so the phase sends again", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := context.Background()
		b.gateway.LoseNextRequest()
		b.requireNeedsReconcile(t, "k1")
		require.Empty(t, b.gateway.Sent())

		out, err := b.runner(t, nil).Reconcile(ctx, "user:1", "k1")
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, out.Response.Status)
		require.Len(t, b.gateway.Sent(), 1)
		require.NoError(t, b.sentOnce(ctx, out.Record))
	})

	t.Run("unknown: the gateway cannot tell, so the key waits", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := context.Background()
		b.gateway.LoseNextAnswer()
		b.requireNeedsReconcile(t, "k1")
		b.gateway.SetLookupDown(true)

		out, err := b.runner(t, nil).Reconcile(ctx, "user:1", "k1")
		require.ErrorIs(t, err, idem.ErrNeedsReconcile)
		require.Equal(t, idem.OutcomeNeedsReconcile, out.Kind)
		rec, err := b.store.GetKey(ctx, "user:1", "k1")
		require.NoError(t, err)
		require.Equal(t, idemtype.StoredNeedsReconcile, rec.Status)
		require.Nil(t, rec.LockedAt, "left unlocked for the next reconcile run")
		require.Contains(t, rec.LastError, "gateway lookup of msg-")
		require.Contains(t, rec.LastError, "lookup unavailable")

		// Clients still get "needs reconcile", never a second message.
		b.requireNeedsReconcile(t, "k1")
		require.Len(t, b.gateway.Sent(), 1)

		b.gateway.SetLookupDown(false)
		out, err = b.runner(t, nil).Reconcile(ctx, "user:1", "k1")
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, out.Response.Status)
		require.NoError(t, b.sentOnce(ctx, out.Record))
	})
}

func (b *bundle) requireNeedsReconcile(t *testing.T, key string) {
	t.Helper()
	out, err := b.runner(t, nil).Execute(context.Background(), b.sender.Flow(), b.request(key))
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	require.Equal(t, idem.OutcomeNeedsReconcile, out.Kind)
}

func TestNewSenderChecksItsArguments(t *testing.T) {
	t.Parallel()
	_, err := sms.NewSender(nil, "")
	require.Error(t, err)
	_, err = sms.NewSender(&sms.FakeGateway{}, "not a schema!")
	require.Error(t, err)
}

func scenario(t *testing.T, rep *idemtest.Report, name string) *idemtest.Scenario {
	t.Helper()
	for _, s := range rep.Scenarios {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no scenario %q", name)
	return nil
}
