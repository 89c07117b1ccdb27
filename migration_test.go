package idem_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/migrations"
)

// oldKeyState is a key as the version 2 schema held it, in the columns
// migration 0003 moves to idem_leases.
type oldKeyState struct {
	Key            string
	Status         string
	RecoveryPoint  string
	Fence          int64
	LockedAt       *time.Time
	LeaseExpiresAt *time.Time
	ForeignMark    *string
}

func oldKeyStates(t *testing.T, b *testBundle) []oldKeyState {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `
		SELECT key, status, recovery_point, fence, locked_at, lease_expires_at, foreign_mark
		FROM idem_keys ORDER BY key`)
	require.NoError(t, err)
	defer rows.Close()
	var out []oldKeyState
	for rows.Next() {
		var s oldKeyState
		require.NoError(t, rows.Scan(&s.Key, &s.Status, &s.RecoveryPoint, &s.Fence, &s.LockedAt, &s.LeaseExpiresAt, &s.ForeignMark))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// oldSchema writes keys the way the version 2 store did: the same
// statements, with the lease and the mark on idem_keys.
type oldSchema struct {
	t *testing.T
	b *testBundle
}

// acquire inserts a key locked, as the old acquisition did, at the bundle's
// clock, and returns its id.
func (o oldSchema) acquire(flow, key, path string, input any) int64 {
	params, err := json.Marshal(input)
	require.NoError(o.t, err)
	fingerprint, err := idem.Fingerprint(flow, params)
	require.NoError(o.t, err)
	var id int64
	require.NoError(o.t, o.b.pool.QueryRow(context.Background(), `
		INSERT INTO idem_keys (scope, key, flow, method, path, fingerprint, params,
		                       locked_at, lease_expires_at, created_at, last_run_at)
		VALUES ('user:1', $2, $3, 'POST', $4, $5, $6, $1::timestamptz, $1::timestamptz + interval '90 seconds', $1, $1)
		RETURNING id`, o.b.clock.Now(), key, flow, path, fingerprint, params).Scan(&id))
	return id
}

// exec runs one of the old store's statements on key id, guarded by fence 1
// as the old store guarded it, and requires that it matched.
func (o oldSchema) exec(id int64, sql string, args ...any) {
	tag, err := o.b.pool.Exec(context.Background(), sql, append([]any{id, int64(1), o.b.clock.Now()}, args...)...)
	require.NoError(o.t, err)
	require.Equal(o.t, int64(1), tag.RowsAffected(), sql)
}

// The old store's statements, reduced to what they wrote ($3 is the clock).
const (
	oldAdvance = `UPDATE idem_keys SET recovery_point = $4, checkpoint = checkpoint || $5::jsonb, foreign_mark = NULL,
		last_run_at = $3, lease_expires_at = $3::timestamptz + interval '90 seconds' WHERE id = $1 AND fence = $2`
	oldMark              = `UPDATE idem_keys SET foreign_mark = $4 WHERE id = $1 AND fence = $2 AND status = 'running' AND $3::timestamptz IS NOT NULL`
	oldRelease           = `UPDATE idem_keys SET locked_at = NULL, lease_expires_at = NULL, last_error = $4 WHERE id = $1 AND fence = $2 AND status = 'running' AND $3::timestamptz IS NOT NULL`
	oldSetNeedsReconcile = `UPDATE idem_keys SET status = 'needs_reconcile', locked_at = NULL, lease_expires_at = NULL, last_error = $4
		WHERE id = $1 AND fence = $2 AND status <> 'finished' AND $3::timestamptz IS NOT NULL`
	oldFinish = `UPDATE idem_keys SET status = 'finished', recovery_point = 'finished', foreign_mark = NULL, locked_at = NULL,
		lease_expires_at = NULL, last_run_at = $3, finished_at = $3, expires_at = $3::timestamptz + interval '24 hours',
		response_status = 201, response_headers = '{"Content-Type": ["application/json"]}', response_body = $4
		WHERE id = $1 AND fence = $2`
	oldCrash = `UPDATE idem_keys SET lease_expires_at = $3::timestamptz - interval '1 second' WHERE id = $1 AND fence = $2`
)

// Migration 0003 moves the lease and the foreign mark of keys written by the
// version 2 schema to idem_leases, and the runner carries on with every one
// of them: it replays the finished, turns the live one away, takes over the
// stale and the released ones and resumes them where they were, and never
// re-sends a not-idempotent call in doubt. Down puts the columns back as
// they were, and keeps the marks that are still in doubt (and only those)
// of keys the new schema wrote.
func TestMigration0003MovesLeasesAndMarks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewSchema(t)
	m, err := migrations.New(schema.Pool, &migrations.Config{Schema: schema.Name})
	require.NoError(t, err)
	for v := 1; v <= 2; v++ {
		script, err := m.Script(migrations.FormatSQL, migrations.DirectionUp, v)
		require.NoError(t, err)
		_, err = schema.Pool.Exec(ctx, script)
		require.NoError(t, err)
	}
	v, err := m.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, v)

	b := setupSMSOn(t, setupOn(t, schema))
	old := oldSchema{t, b.testBundle}
	ride := rideInput{Origin: "SF", Amount: 20}
	sms := smsInput{To: "+15550100", Text: "your ride is here"}
	rideAt := func(id int64) {
		var rideID int64
		require.NoError(t, b.pool.QueryRow(ctx, `INSERT INTO rides (key_id, origin) VALUES ($1, 'SF') RETURNING id`, id).Scan(&rideID))
		old.exec(id, oldAdvance, "ride_created", `{"ride_id": `+strconv.FormatInt(rideID, 10)+`}`)
	}
	messageAt := func(id int64) {
		var msgID int64
		require.NoError(t, b.pool.QueryRow(ctx, `INSERT INTO messages (to_number) VALUES ($1) RETURNING id`, sms.To).Scan(&msgID))
		old.exec(id, oldAdvance, "message_saved", `{"message_id": `+strconv.FormatInt(msgID, 10)+`}`)
	}

	// finished: replayed byte for byte.
	old.exec(old.acquire("rides.create", "finished", "/rides", ride), oldFinish, []byte(`{"ride_id": 41}`))
	// live: a worker inside charge_created, its lease fresh.
	rideAt(old.acquire("rides.create", "live", "/rides", ride))
	// stale: its worker died inside charge_created; the lease ran out.
	id := old.acquire("rides.create", "stale", "/rides", ride)
	rideAt(id)
	old.exec(id, oldCrash)
	// released: its first phase failed and it was released.
	old.exec(old.acquire("rides.create", "released", "/rides", ride), oldRelease, "provider timed out")
	// reconcile: the SMS went out, the phase did not commit, the key was
	// parked for reconcile with its mark.
	id = old.acquire("sms.send", "reconcile", "", sms)
	messageAt(id)
	old.exec(id, oldMark, "sms_sent")
	old.exec(id, oldSetNeedsReconcile, "connection reset after the gateway accepted the message")
	// marked: the worker died right after marking, before its call; nobody
	// has looked at the key since.
	id = old.acquire("sms.send", "marked", "", sms)
	messageAt(id)
	old.exec(id, oldMark, "sms_sent")
	old.exec(id, oldCrash)

	before := oldKeyStates(t, b.testBundle)
	require.Len(t, before, 6)

	// Up: every key reads as it did.
	_, err = m.Up(ctx)
	require.NoError(t, err)
	for _, s := range before {
		rec := b.key(t, s.Key)
		require.Equal(t, s.Status, string(rec.Status), s.Key)
		require.Equal(t, s.RecoveryPoint, rec.RecoveryPoint, s.Key)
		require.Equal(t, s.Fence, rec.Fence, s.Key)
		require.Equal(t, s.LockedAt, rec.LockedAt, s.Key)
		require.Equal(t, s.LeaseExpiresAt, rec.LeaseExpiresAt, s.Key)
		require.Equal(t, deref(s.ForeignMark), rec.ForeignMark, s.Key)
	}
	require.Equal(t, 5, b.countRows(t, "idem_leases"), "a lease row for each unfinished key")

	// Down and up again: down restores the columns exactly.
	_, err = m.Down(ctx, 2)
	require.NoError(t, err)
	require.Equal(t, before, oldKeyStates(t, b.testBundle))
	_, err = m.Up(ctx)
	require.NoError(t, err)

	rides := b.testBundle.runner(t, nil)
	texts := b.testBundle.runner(t, &idem.Config{Flows: []idem.AnyFlow{b.flow}})

	out, err := rides.Execute(ctx, b.testBundle.flow, b.request("finished", ride))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
	require.Equal(t, `{"ride_id": 41}`, string(out.Response.Body))

	out, err = rides.Execute(ctx, b.testBundle.flow, b.request("live", ride))
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.Equal(t, 2*time.Second, out.RetryAfter)

	out, err = rides.Execute(ctx, b.testBundle.flow, b.request("stale", ride))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.True(t, out.TookOver)
	require.Equal(t, map[string]int{"charge_created": 1, "receipt_enqueued": 1}, b.counts.Get(), "resumed after ride_created")

	out, err = rides.Execute(ctx, b.testBundle.flow, b.request("released", ride))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, 1, b.counts.Get()["ride_created"], "the released key ran from its start")

	out, err = texts.Execute(ctx, b.flow, b.req("reconcile"))
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	require.Equal(t, idem.OutcomeNeedsReconcile, out.Kind)
	b.gateway.sent[b.ref(t, "reconcile")] = 1 // what the old worker's call did
	out, err = texts.Reconcile(ctx, "user:1", "reconcile")
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, http.StatusCreated, out.Response.Status)
	require.Equal(t, 1, b.gateway.times(b.ref(t, "reconcile")))

	out, err = texts.Execute(ctx, b.flow, b.req("marked"))
	require.ErrorIs(t, err, idem.ErrNeedsReconcile, "the mark survived the migration: no blind re-send")
	require.True(t, out.TookOver)
	out, err = texts.Reconcile(ctx, "user:1", "marked")
	require.NoError(t, err, "not done: the phase runs again, now safely")
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, 1, b.gateway.times(b.ref(t, "marked")))
	require.Zero(t, b.countRows(t, "messages WHERE NOT sent"))

	b.clock.Advance(2 * time.Minute)
	out, err = rides.Execute(ctx, b.testBundle.flow, b.request("live", ride))
	require.NoError(t, err, "the live key, once its lease ran out")
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 3, "receipt_enqueued": 3, "reconcile": 2, "sms_sent": 1},
		b.counts.Get(), "the SMS phase ran once: for the key whose call reconcile found not made")
	require.Equal(t, 3, b.countRows(t, "rides"), "the live, stale and released keys' rides, each made once")
	require.Zero(t, b.countRows(t, "rides WHERE charge_id IS NULL"))

	// Keys the new schema wrote, going down: a mark still in doubt is kept,
	// a mark its phase's commit retired is not.
	crashAt := func(where idem.HookWhere, phase string) *idem.Runner {
		return b.runner(t, func(_ context.Context, at idem.HookPoint) error {
			if at.Where == where && at.Phase == phase {
				return idem.ErrSimulatedCrash
			}
			return nil
		})
	}
	_, err = crashAt(idem.HookAfterForeign, "sms_sent").Execute(ctx, b.flow, b.req("in-doubt"))
	require.ErrorIs(t, err, idem.ErrSimulatedCrash)
	_, err = crashAt(idem.HookAfterCommit, "sms_sent").Execute(ctx, b.flow, b.req("retired"))
	require.ErrorIs(t, err, idem.ErrSimulatedCrash)
	require.Equal(t, "sms_sent", b.key(t, "in-doubt").ForeignMark)
	require.Empty(t, b.key(t, "retired").ForeignMark)

	_, err = m.Down(ctx, 2)
	require.NoError(t, err)
	states := map[string]oldKeyState{}
	for _, s := range oldKeyStates(t, b.testBundle) {
		states[s.Key] = s
	}
	require.Equal(t, "sms_sent", deref(states["in-doubt"].ForeignMark))
	require.Nil(t, states["retired"].ForeignMark)
	require.NotNil(t, states["retired"].LockedAt, "a crashed worker leaves its lock")
	for _, key := range []string{"finished", "live", "stale", "released", "reconcile", "marked"} {
		require.Equal(t, "finished", states[key].Status, key)
		require.Nil(t, states[key].LockedAt, key)
		require.Nil(t, states[key].ForeignMark, key)
	}

	// And up again: both resume as they should.
	_, err = m.Up(ctx)
	require.NoError(t, err)
	b.clock.Advance(2 * time.Minute)
	out, err = texts.Execute(ctx, b.flow, b.req("in-doubt"))
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	require.Equal(t, idem.OutcomeNeedsReconcile, out.Kind)
	out, err = texts.Execute(ctx, b.flow, b.req("retired"))
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.Equal(t, 1, b.gateway.times(b.ref(t, "retired")))
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
