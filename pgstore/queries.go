package pgstore

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/go-idem/idem/idemdriver"
)

// queries holds every statement of the store, rendered once for the
// configured schema.
//
// Conventions: $now parameters are nullable timestamptz; NULL means the
// database clock, a value is a test's injected clock. Durations travel as
// bigint microseconds. Every statement that touches a locked key is guarded
// by "id = $1 AND fence = $2".
type queries struct {
	table string

	acquire, takeOver, claimReconcile      string
	advancePhase, finishPhase              string
	heartbeat, release                     string
	markForeign, setNeedsReconcile, getKey string

	unlockKey, claimIdle, reap, reapAbandoned, statementTimeout, clock string
}

// recordColumns renders the columns of idemdriver.KeyRecord from a row alias,
// mapping NULLs of text and int columns to zero values.
func recordColumns(alias string) string {
	cols := `{a}id, {a}request_id::text AS request_id, {a}downstream_scheme, {a}scope, {a}key, {a}flow, {a}method, {a}path,
		{a}fingerprint, {a}params, {a}status, {a}recovery_point, {a}checkpoint,
		coalesce({a}foreign_mark, '') AS foreign_mark, {a}locked_at, {a}lease_expires_at, {a}fence,
		coalesce({a}response_status, 0) AS response_status, coalesce({a}response_headers, '{}') AS response_headers,
		{a}response_body, {a}attempts, coalesce({a}last_error, '') AS last_error,
		{a}created_at, {a}last_run_at, {a}finished_at, {a}expires_at,
		coalesce({a}params_key_id, '') AS params_key_id, coalesce({a}response_key_id, '') AS response_key_id`
	if alias != "" {
		alias += "."
	}
	return strings.ReplaceAll(cols, "{a}", alias)
}

// recordDest returns the scan destinations of recordColumns, in the same
// order, so the hot paths (acquisition, reconcile claims, GetKey) scan rows
// with pgx directly: scany's reflection costs more per row than the
// acquisition statement itself. Keep the two lists in step; a test checks.
func recordDest(rec *idemdriver.KeyRecord) []any {
	return []any{&rec.ID, &rec.RequestID, &rec.DownstreamScheme, &rec.Scope, &rec.Key, &rec.Flow, &rec.Method, &rec.Path,
		&rec.Fingerprint, &rec.Params, &rec.Status, &rec.RecoveryPoint, &rec.Checkpoint,
		&rec.ForeignMark, &rec.LockedAt, &rec.LeaseExpiresAt, &rec.Fence,
		&rec.ResponseStatus, &rec.ResponseHeaders,
		&rec.ResponseBody, &rec.Attempts, &rec.LastError,
		&rec.CreatedAt, &rec.LastRunAt, &rec.FinishedAt, &rec.ExpiresAt,
		&rec.ParamsKeyID, &rec.ResponseKeyID}
}

func newQueries(prefix string) *queries {
	t := prefix + "idem_keys"
	q := &queries{table: t}
	render := func(sql string) string {
		sql = strings.ReplaceAll(sql, "{t}", t)
		for _, alias := range []string{"inserted", "taken", "existing", "claimed", "unlocked", "k", ""} {
			sql = strings.ReplaceAll(sql, "{cols:"+alias+"}", recordColumns(alias))
		}
		return sql
	}

	// acquire: one statement, one round trip, for a new key, a replay and an
	// in-progress key alike.
	//
	//  - existing reads the row, if any, from the statement's snapshot.
	//  - expired deletes it when it is a finished key past its expiry: such a
	//    key is absent whether or not the reaper has run, and is never
	//    replayed. Only a row existing found is probed.
	//  - inserted inserts the key locked when there was none, or in place of
	//    the expired one (a row the statement itself deleted is no conflict);
	//    ON CONFLICT DO NOTHING turns a concurrent insert of the same key into
	//    "no row" instead of a unique violation that would abort the caller.
	//  - the final SELECT reports the insert, or the row as it is, unless it
	//    is expired.
	//
	// Replays and in-progress answers write nothing: no transaction id, no
	// WAL, no row lock. Zero rows come back when a concurrent insert
	// committed after the snapshot, or when a concurrent acquirer (or the
	// reaper) deleted the expired row first; the caller runs the statement
	// again, whose snapshot sees what that one did.
	//
	// Taking over an abandoned key is a second statement (takeOver), sent
	// only when the row looks takeable: keeping an UPDATE out of this one
	// spares every replay the cost of setting one up, and takeovers are rare.
	q.acquire = render(`
WITH clock AS (
    SELECT coalesce($1::timestamptz, now()) AS t
), existing AS (
    SELECT * FROM {t} WHERE scope = $2 AND key = $3
), expired AS (
    DELETE FROM {t} d
    USING existing e
    WHERE NOT $10::boolean AND e.status = 'finished' AND e.expires_at <= (SELECT t FROM clock)
      AND d.id = e.id AND d.status = 'finished' AND d.expires_at <= (SELECT t FROM clock)
    RETURNING d.id
), inserted AS (
    INSERT INTO {t} (scope, key, flow, method, path, fingerprint, params,
                     locked_at, lease_expires_at, created_at, last_run_at, params_key_id)
    SELECT $2, $3, $4, $5, $6, $7, $8, clock.t, clock.t + $9::bigint * interval '1 microsecond', clock.t, clock.t,
           nullif($11::text, '')
    FROM clock
    WHERE NOT $10::boolean AND (NOT EXISTS (SELECT 1 FROM existing) OR EXISTS (SELECT 1 FROM expired))
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING *
)
SELECT 'created' AS acquired, (SELECT t FROM clock) AS db_now, {cols:inserted} FROM inserted
UNION ALL
SELECT 'none', clock.t, {cols:existing} FROM existing, clock
WHERE NOT (existing.status = 'finished' AND existing.expires_at <= clock.t)`)

	// takeOver locks an unfinished key of the same flow and fingerprint that
	// nobody holds (unlocked, or lease expired), with a new fence. Its WHERE
	// is re-checked against the latest row version under the row lock, so of
	// two workers racing for one stale key exactly one wins.
	q.takeOver = render(`
WITH clock AS (
    SELECT coalesce($1::timestamptz, now()) AS t
)
UPDATE {t} k
SET fence = k.fence + 1, locked_at = clock.t, lease_expires_at = clock.t + $5::bigint * interval '1 microsecond',
    last_run_at = clock.t, attempts = k.attempts + 1
FROM clock
WHERE k.id = $2 AND k.status = 'running' AND k.flow = $3 AND k.fingerprint = $4
  AND (k.locked_at IS NULL OR k.lease_expires_at <= clock.t)
RETURNING 'taken_over' AS acquired, clock.t AS db_now, {cols:k}`)

	q.claimReconcile = render(`
WITH clock AS (
    SELECT coalesce($1::timestamptz, now()) AS t
), claimed AS (
    UPDATE {t} k
    SET fence = k.fence + 1, locked_at = clock.t, lease_expires_at = clock.t + $4::bigint * interval '1 microsecond',
        last_run_at = clock.t, attempts = k.attempts + 1
    FROM clock
    WHERE k.scope = $2 AND k.key = $3 AND k.status = 'needs_reconcile'
      AND (k.locked_at IS NULL OR k.lease_expires_at <= clock.t)
    RETURNING k.*
)
SELECT 'taken_over' AS acquired, (SELECT t FROM clock) AS db_now, {cols:claimed} FROM claimed
UNION ALL
SELECT 'none', (SELECT t FROM clock), {cols:k} FROM {t} k
WHERE k.scope = $2 AND k.key = $3 AND NOT EXISTS (SELECT 1 FROM claimed)`)

	// advancePhase and finishPhase record a phase's commit on its key. They
	// run inside the phase's transaction, pipelined with its COMMIT
	// (phaseTx.commitGuarded). A moved fence must therefore fail the
	// statement, not merely match no row, or the COMMIT behind it would
	// commit a taken-over worker's writes: dividing by the count of updated
	// rows raises division_by_zero (22012) exactly when the guard matched
	// nothing, and nothing else in the statements can divide.
	//
	// They write only what changes, and no indexed column while the key
	// stays running, so an advance is a HOT update. clock_timestamp(), not
	// now(): now() is when the transaction began, and a long phase must not
	// shorten the lease it renews.
	q.advancePhase = render(`
WITH guarded AS (
UPDATE {t}
SET status           = 'running',
    recovery_point   = $3,
    checkpoint       = CASE WHEN $4::jsonb = '{}' THEN checkpoint ELSE checkpoint || $4::jsonb END,
    foreign_mark     = NULL,
    last_run_at      = coalesce($6::timestamptz, clock_timestamp()),
    lease_expires_at = coalesce($6::timestamptz, clock_timestamp()) + $5::bigint * interval '1 microsecond'
WHERE id = $1 AND fence = $2
RETURNING 1
)
SELECT 1 / count(*)::int FROM guarded`)

	q.finishPhase = render(`
WITH guarded AS (
UPDATE {t}
SET status           = 'finished',
    recovery_point   = 'finished',
    checkpoint       = CASE WHEN $3::jsonb = '{}' THEN checkpoint ELSE checkpoint || $3::jsonb END,
    foreign_mark     = NULL,
    locked_at        = NULL,
    lease_expires_at = NULL,
    last_run_at      = coalesce($8::timestamptz, clock_timestamp()),
    finished_at      = coalesce($8::timestamptz, clock_timestamp()),
    expires_at       = coalesce($8::timestamptz, clock_timestamp()) + $7::bigint * interval '1 microsecond',
    response_status  = $4,
    response_headers = $5::jsonb,
    response_body    = $6,
    response_key_id  = nullif($9::text, '')
WHERE id = $1 AND fence = $2
RETURNING 1
)
SELECT 1 / count(*)::int FROM guarded`)

	q.heartbeat = render(`
UPDATE {t}
SET lease_expires_at = coalesce($4::timestamptz, now()) + $3::bigint * interval '1 microsecond'
WHERE id = $1 AND fence = $2 AND locked_at IS NOT NULL AND status <> 'finished'
RETURNING lease_expires_at`)

	q.release = render(`
UPDATE {t}
SET locked_at = NULL, lease_expires_at = NULL, last_error = left($3, 4000)
WHERE id = $1 AND fence = $2 AND status = 'running'`)

	q.markForeign = render(`
UPDATE {t}
SET foreign_mark = $3
WHERE id = $1 AND fence = $2 AND status = 'running'`)

	q.setNeedsReconcile = render(`
UPDATE {t}
SET status = 'needs_reconcile', locked_at = NULL, lease_expires_at = NULL, last_error = left($3, 4000)
WHERE id = $1 AND fence = $2 AND status <> 'finished'`)

	q.getKey = render(`SELECT {cols:} FROM {t} WHERE scope = $1 AND key = $2`)

	// unlockKey moves the fence on, which is what actually stops a live
	// holder: its next guarded statement matches no row. The foreign mark
	// stays, so a not-idempotent call in doubt still goes to reconcile. The
	// second branch reports a finished (or concurrently vanished) key as it
	// is.
	q.unlockKey = render(`
WITH unlocked AS (
    UPDATE {t} k
    SET fence = k.fence + 1, locked_at = NULL, lease_expires_at = NULL, last_error = left($3, 4000)
    WHERE k.scope = $1 AND k.key = $2 AND k.status <> 'finished'
    RETURNING k.*
)
SELECT true AS unlocked, {cols:unlocked} FROM unlocked
UNION ALL
SELECT false, {cols:k} FROM {t} k
WHERE k.scope = $1 AND k.key = $2 AND NOT EXISTS (SELECT 1 FROM unlocked)`)

	// claimIdle hands each idle key to one caller: FOR UPDATE SKIP LOCKED
	// passes over rows another claimer is marking, and a row it marked and
	// committed no longer looks idle (the WHERE is re-checked on the latest
	// version). "status <> 'finished'" restates the partial index's
	// predicate, so even a generic plan of this prepared statement can use
	// idem_keys_unfinished rather than scan the finished millions.
	q.claimIdle = render(`
WITH clock AS (
    SELECT coalesce($1::timestamptz, now()) AS t
), candidates AS (
    SELECT k.id
    FROM {t} k, clock c
    WHERE k.status <> 'finished' AND k.status = $2 AND k.flow = ANY($3::text[])
      AND (k.locked_at IS NULL OR k.lease_expires_at <= c.t)
      AND k.last_run_at <= c.t - $4::bigint * interval '1 microsecond'
      AND ($5::int <= 0 OR k.attempts < $5::int)
    ORDER BY k.last_run_at
    LIMIT $6
    FOR UPDATE OF k SKIP LOCKED
), claimed AS (
    UPDATE {t} k
    SET last_run_at = clock.t
    FROM candidates, clock
    WHERE k.id = candidates.id
    RETURNING k.*
)
SELECT {cols:claimed} FROM claimed ORDER BY claimed.id`)

	// reap deletes one batch through idem_keys_reap. The ids are collected
	// into an array first so the DELETE finds its rows by primary key
	// rather than by a join the planner might turn into a scan. Deleting a
	// key sets the key column of business rows that reference it to NULL
	// (their foreign keys are ON DELETE SET NULL); those rows survive.
	q.reap = render(`
DELETE FROM {t}
WHERE id = ANY(ARRAY(
    SELECT id FROM {t}
    WHERE status = 'finished' AND expires_at <= coalesce($1::timestamptz, now())
    ORDER BY expires_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
))`)

	// reapAbandoned deletes one batch of keys abandoned unfinished: running
	// (never needs_reconcile), nobody holding them, created longer ago than
	// their flow's age ($3/$4 name flows with ages of their own, in
	// microseconds; $2 is everyone else's; a negative age never abandons).
	// FOR UPDATE re-checks the lease on the latest row version, so a key
	// taken over meanwhile is left alone. Candidates come from
	// idem_keys_unfinished.
	q.reapAbandoned = render(`
DELETE FROM {t}
WHERE id = ANY(ARRAY(
    SELECT k.id
    FROM {t} k
    CROSS JOIN (SELECT coalesce($1::timestamptz, now()) AS t) c
    LEFT JOIN unnest($3::text[], $4::bigint[]) AS f(flow, age) ON f.flow = k.flow
    WHERE k.status <> 'finished' AND k.status = 'running'
      AND (k.locked_at IS NULL OR k.lease_expires_at <= c.t)
      AND coalesce(f.age, $2::bigint) >= 0
      AND k.created_at <= c.t - coalesce(f.age, $2::bigint) * interval '1 microsecond'
    ORDER BY k.id
    LIMIT $5
    FOR UPDATE OF k SKIP LOCKED
))`)

	// statementTimeout bounds the statements after it in the same
	// transaction (milliseconds, as text).
	q.statementTimeout = `SELECT set_config('statement_timeout', $1, true)`

	q.clock = `SELECT coalesce($1::timestamptz, now()) AS t`
	return q
}

// commitStatement is the guarded statement that records p on its key:
// advancePhase for a phase that advances, finishPhase for one that responds.
// bodyKeyID names the key that sealed p.Response.Body ("": in the clear).
func (q *queries) commitStatement(p idemdriver.CommitParams, bodyKeyID string) (string, []any, error) {
	patch := []byte("{}")
	if len(p.CheckpointPatch) > 0 {
		var err error
		if patch, err = json.Marshal(p.CheckpointPatch); err != nil {
			return "", nil, fmt.Errorf("pgstore: encode checkpoint: %w", err)
		}
	}
	switch {
	case p.Status == idemdriver.StatusFinished && p.Response != nil:
		body, header := p.Response.Body, p.Response.Header
		if body == nil {
			body = []byte{}
		}
		if header == nil {
			header = map[string][]string{}
		}
		return q.finishPhase, []any{p.Ref.ID, p.Ref.Fence, json.RawMessage(patch), p.Response.Status, header, body, p.Retention.Microseconds(), p.Now, bodyKeyID}, nil
	case p.Status == idemdriver.StatusRunning:
		return q.advancePhase, []any{p.Ref.ID, p.Ref.Fence, p.RecoveryPoint, json.RawMessage(patch), p.Lease.Microseconds(), p.Now}, nil
	}
	return "", nil, fmt.Errorf("pgstore: commit phase: status %q (with a response: %t) is neither an advance nor a finish", p.Status, p.Response != nil)
}

// keyStateConditions are the WHERE conditions of each idemdriver.KeyState, over
// alias k and the clock c. Unfinished states restate the partial index's
// predicate so the planner can use it.
var keyStateConditions = map[idemdriver.KeyState]string{
	idemdriver.KeyStateRunning:        `k.status <> 'finished' AND k.status = 'running' AND k.locked_at IS NOT NULL AND k.lease_expires_at > c.t`,
	idemdriver.KeyStateStale:          `k.status <> 'finished' AND k.status = 'running' AND (k.locked_at IS NULL OR k.lease_expires_at <= c.t)`,
	idemdriver.KeyStateNeedsReconcile: `k.status <> 'finished' AND k.status = 'needs_reconcile'`,
	idemdriver.KeyStateFinished:       `k.status = 'finished' AND k.expires_at > c.t`,
	idemdriver.KeyStateExpired:        `k.status = 'finished' AND k.expires_at <= c.t`,
}

// listKeys renders the key listing for p: only the filters p sets appear,
// so each combination gets a plan of its own.
func (q *queries) listKeys(p idemdriver.ListKeysParams) (string, []any, error) {
	args := []any{p.Now}
	var where []string
	add := func(cond string, arg any) {
		args = append(args, arg)
		where = append(where, strings.ReplaceAll(cond, "$?", fmt.Sprintf("$%d", len(args))))
	}
	if p.State != "" {
		cond, ok := keyStateConditions[p.State]
		if !ok {
			return "", nil, fmt.Errorf("%w: unknown key state %q", idemdriver.ErrInvalidRequest, p.State)
		}
		where = append(where, cond)
	}
	if p.Scope != "" {
		add("k.scope = $?", p.Scope)
	}
	if p.Key != "" {
		add("k.key = $?", p.Key)
	}
	if p.Flow != "" {
		add("k.flow = $?", p.Flow)
	}
	if p.BeforeID > 0 {
		add("k.id < $?", p.BeforeID)
	}
	if len(where) == 0 {
		where = append(where, "true")
	}
	args = append(args, p.Limit)
	sql := fmt.Sprintf(`
WITH clock AS (
    SELECT coalesce($1::timestamptz, now()) AS t
)
SELECT c.t AS db_now, %s
FROM %s k, clock c
WHERE %s
ORDER BY k.id DESC
LIMIT $%d`, recordColumns("k"), q.table, strings.Join(where, "\n  AND "), len(args))
	return sql, args, nil
}
