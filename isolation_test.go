package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
)

// isoRun is what one cell of the isolation matrix observed.
type isoRun struct {
	beats     chan struct{}
	reconcile atomic.Int32 // EventNeedsReconcile events
	retried   atomic.Int32 // EventPhaseRetried events
}

// config is a runner configuration at isolation iso that feeds heartbeat
// events to beats and counts the events the matrix asserts on. Heartbeats
// are frequent, so a phase can stay open across several of them quickly.
func (o *isoRun) config(iso pgx.TxIsoLevel, flow idem.AnyFlow) *idem.Config {
	return &idem.Config{
		Flows: []idem.AnyFlow{flow}, Isolation: iso,
		Lease: 10 * time.Second, HeartbeatInterval: 20 * time.Millisecond,
		Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) {
			switch e.Kind {
			case idem.EventHeartbeat:
				select {
				case o.beats <- struct{}{}:
				default:
				}
			case idem.EventNeedsReconcile:
				o.reconcile.Add(1)
			case idem.EventPhaseRetried:
				o.retried.Add(1)
			}
		}),
	}
}

// waitBeats waits inside a phase until n heartbeats have renewed the lease
// after the phase's first statement, so the phase's transaction stays open
// while they land. Beats from before are drained first.
func (o *isoRun) waitBeats(ctx context.Context, n int) error {
	for len(o.beats) > 0 {
		<-o.beats
	}
	timeout := time.After(30 * time.Second)
	for i := 0; i < n; i++ {
		select {
		case <-o.beats:
		case <-timeout:
			return fmt.Errorf("only %d of %d heartbeats within 30s", i, n)
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	return nil
}

func newIsoRun() *isoRun { return &isoRun{beats: make(chan struct{}, 64)} }

// Every flow shape makes progress at every isolation level a phase may
// run at. Under repeatable read and serializable, the guarded commit of a
// phase fails with a serialization failure if the row it updates has a
// version newer than the phase's snapshot; heartbeats (from another
// connection, while the phase runs) and foreign marks (just before the call)
// must therefore not write that row version. Each cell asserts: executed,
// each phase's writes once, the foreign call once, the key finished, never
// needs_reconcile.
func TestIsolationLevels(t *testing.T) {
	t.Parallel()
	levels := []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}
	shapes := []struct {
		name string
		run  func(t *testing.T, iso pgx.TxIsoLevel)
	}{
		{"idempotent foreign call", isoIdempotentCall},
		{"not idempotent call after a statement", isoNotIdempotentAfterStatement},
		{"phase longer than three heartbeats", isoSlowPhase},
		{"not idempotent call held across heartbeats", isoNotIdempotentSlow},
	}
	for _, iso := range levels {
		for _, shape := range shapes {
			t.Run(strings.ReplaceAll(string(iso), " ", "_")+"/"+strings.ReplaceAll(shape.name, " ", "_"), func(t *testing.T) {
				t.Parallel()
				shape.run(t, iso)
			})
		}
	}
}

// The ride flow: a statement in every phase, an idempotent charge in the
// second, which reads its ride before calling.
func isoIdempotentCall(t *testing.T, iso pgx.TxIsoLevel) {
	b := setup(t)
	o := newIsoRun()
	b.hooks["charge_created"] = func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) error {
		var n int
		return tx.QueryRow(ctx, `SELECT count(*) FROM rides WHERE key_id = $1`, run.Key().ID).Scan(&n)
	}
	r := b.runner(t, o.config(iso, b.flow))
	out, err := r.Execute(context.Background(), b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 1, "receipt_enqueued": 1}, b.counts.Get())
	require.Equal(t, 1, b.countRows(t, "rides WHERE charge_id IS NOT NULL"))
	require.Equal(t, 1, b.countRows(t, "jobs"))
	require.Equal(t, 1, b.provider.Calls(), "the foreign call once")
	isoFinished(t, b.key(t, "k1"), o)
}

// smsFlow is a not-idempotent flow whose sending phase reads its message
// (a statement, so under repeatable read its snapshot predates the foreign
// mark) before it calls, and waits for beats heartbeats after the call when
// beats > 0.
func isoSMSFlow(b *smsBundle, o *isoRun, beats int, hookRuns *atomic.Int32) *idem.Flow[smsInput] {
	return idem.MustNewFlow("sms.iso", []idem.Phase[smsInput]{
		{
			Name: "message_saved",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[smsInput]) (idem.Result, error) {
				b.counts.Add("message_saved")
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
				var id int64
				if _, err := run.Checkpoint("message_id", &id); err != nil {
					return idem.Result{}, err
				}
				var sent bool
				if err := tx.QueryRow(ctx, `SELECT sent FROM messages WHERE id = $1`, id).Scan(&sent); err != nil {
					return idem.Result{}, err
				}
				if sent {
					return idem.Result{}, errors.New("the message is already sent")
				}
				ref := run.IdempotencyKey()
				if err := run.Foreign(ctx, "send_sms", func(context.Context, string) error { return b.gateway.send(ref) }); err != nil {
					return idem.Result{}, err
				}
				if beats > 0 {
					if err := o.waitBeats(ctx, beats); err != nil {
						return idem.Result{}, err
					}
				}
				return idem.Advance(), markSent(ctx, tx, run)
			},
			Reconcile: func(context.Context, idem.Tx, *idem.Attempt[smsInput]) (idem.ReconcileVerdict, error) {
				hookRuns.Add(1)
				return idem.ReconcileUnknown("the matrix never reconciles"), nil
			},
		},
		{
			Name: "responded",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[smsInput]) (idem.Result, error) {
				b.counts.Add("responded")
				var id int64
				if _, err := run.Checkpoint("message_id", &id); err != nil {
					return idem.Result{}, err
				}
				if _, err := tx.Exec(ctx, `UPDATE messages SET to_number = to_number WHERE id = $1`, id); err != nil {
					return idem.Result{}, err
				}
				return idem.RespondJSON(http.StatusCreated, map[string]any{"message_id": id}), nil
			},
		},
	}, nil)
}

func isoNotIdempotent(t *testing.T, iso pgx.TxIsoLevel, beats int) {
	b := setupSMS(t)
	o := newIsoRun()
	var hookRuns atomic.Int32
	flow := isoSMSFlow(b, o, beats, &hookRuns)
	r := b.testBundle.runner(t, o.config(iso, flow))
	out, err := r.Execute(context.Background(), flow, b.req("k1"))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, map[string]int{"message_saved": 1, "sms_sent": 1, "responded": 1}, b.counts.Get())
	require.Equal(t, 1, b.countRows(t, "messages"))
	require.Equal(t, 1, b.countRows(t, "messages WHERE sent"))
	require.Equal(t, 1, b.gateway.times(b.key(t, "k1").DownstreamKey("sms_sent")), "the foreign call once")
	require.Zero(t, hookRuns.Load(), "nothing to reconcile")
	isoFinished(t, b.key(t, "k1"), o)
}

func isoNotIdempotentAfterStatement(t *testing.T, iso pgx.TxIsoLevel) {
	isoNotIdempotent(t, iso, 0)
}

func isoNotIdempotentSlow(t *testing.T, iso pgx.TxIsoLevel) {
	isoNotIdempotent(t, iso, 4)
}

// A phase that writes, then stays open for four heartbeat intervals (each
// heartbeat renewing the lease from another connection), then writes a row
// that references its key, as business rows do (its foreign key check locks
// the key row), and makes its idempotent foreign call, then commits.
func isoSlowPhase(t *testing.T, iso pgx.TxIsoLevel) {
	b := setup(t)
	_, err := b.pool.Exec(context.Background(), `CREATE TABLE notes (key_id bigint NOT NULL REFERENCES idem_keys (id))`)
	require.NoError(t, err)
	o := newIsoRun()
	b.hooks["charge_created"] = func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) error {
		if _, err := tx.Exec(ctx, `INSERT INTO jobs (ride_id, kind) VALUES ($1, 'slow')`, run.Key().ID); err != nil {
			return err
		}
		if err := o.waitBeats(ctx, 4); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO notes (key_id) VALUES ($1)`, run.Key().ID)
		return err
	}
	r := b.runner(t, o.config(iso, b.flow))
	out, err := r.Execute(context.Background(), b.flow, b.request("k1", rideInput{Origin: "SF", Amount: 20}))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 1, "receipt_enqueued": 1}, b.counts.Get())
	require.Equal(t, 1, b.countRows(t, "rides WHERE charge_id IS NOT NULL"))
	require.Equal(t, 1, b.countRows(t, "jobs WHERE kind = 'slow'"))
	require.Equal(t, 1, b.countRows(t, "notes"))
	require.Equal(t, 1, b.countRows(t, "jobs WHERE kind = 'receipt'"))
	require.Equal(t, 1, b.provider.Calls(), "the foreign call once")
	isoFinished(t, b.key(t, "k1"), o)
}

// isoFinished checks the end state every cell shares.
func isoFinished(t *testing.T, rec *idemtype.KeyRecord, o *isoRun) {
	t.Helper()
	require.Equal(t, idemtype.StoredFinished, rec.Status)
	require.Equal(t, idemtype.RecoveryPointFinished, rec.RecoveryPoint)
	require.Empty(t, rec.ForeignMark)
	require.Nil(t, rec.LockedAt)
	require.Equal(t, int64(1), rec.Fence, "never taken over")
	require.Zero(t, o.reconcile.Load(), "never needs_reconcile")
	require.Zero(t, o.retried.Load(), "no phase was retried")
}
