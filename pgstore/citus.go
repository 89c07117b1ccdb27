package pgstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idem/idem/idemdriver"
)

// The store on Citus: idem_keys and idem_leases distributed by scope
// (migrations.Config.Citus; migrations/citus/distribute.up.sql). New finds
// out (Store.Distributed) by asking whether idem_keys is a distributed
// table, and then runs the statements of citusQueries in place of the plain
// ones, which stay exactly as they are on plain PostgreSQL.
//
// Each statement that touches one key names the key's scope, the
// distribution column, on every table it reads or writes, so Citus sends it
// whole to the one worker holding the scope (a router query): the guarded
// phase commit, the heartbeat, the release, the marks, the re-read of a key,
// the reconcile claim, the takeover. The acquisition is the function
// idem_acquire_v11 distributed by its scope argument, which Citus delegates
// to that worker: still one statement from the application. What Citus
// refuses, and what these statements do instead:
//
//   - an UPDATE on a distributed table may not call a VOLATILE function
//     (clock_timestamp()), nor a non-IMMUTABLE one inside CASE or COALESCE
//     (coalesce($now, now())), nor a STABLE one over a column (clock.t +
//     interval, timestamptz arithmetic being STABLE): the clock, and what
//     is computed from it, is computed in a CTE (clock) that the UPDATE
//     joins, statement_timestamp() for clock_timestamp();
//   - a lease row is joined with an explicit l.scope = $scope: a join to
//     k.scope alone is not carried through the LATERAL subquery, and Citus
//     would send the statement to every shard;
//   - SELECT ... FOR UPDATE runs only in router queries: the completer's
//     and the reaper's batches are read without locks from every shard,
//     then claimed key by key, each claim a router statement that re-checks,
//     under the row lock, that the key is as it was read (the same fence,
//     the same last run), so of two claimers one gets each key.
//
// Waiting for a key polls on Citus: migration 0010's triggers would notify
// on the worker that holds the key, where no store listens, and the layout
// drops them.

// Distributed reports whether the store runs on a Citus layout (idem_keys
// distributed by scope), as New found it.
func (s *Store) Distributed() bool { return s.q.citus }

// scoped appends the key's scope to a statement's arguments when the
// statements are Citus's, which all take it as their last parameter.
func (q *queries) scoped(scope string, args ...any) []any {
	if q.citus {
		return append(args, scope)
	}
	return args
}

// citusLeaseOf is leaseOf for Citus: a plain outer join, with the scope
// named (scope, an expression: a parameter or k.scope). A subquery with
// OFFSET 0 cannot be pushed down to the shards in a statement over many.
func citusLeaseOf(leases, scope string) string {
	return `LEFT JOIN ` + leases + ` l ON l.scope = ` + scope + ` AND l.key_id = k.id AND k.status <> 'finished'`
}

// useCitus replaces the statements that Citus refuses or runs on every
// shard with ones it routes to the key's worker. Every replaced statement
// takes the parameters of the plain one, then the key's scope (see
// queries.scoped), except those noted.
func (q *queries) useCitus() {
	q.citus = true
	t, l := q.table, q.leases
	render := func(sql string) string {
		sql = strings.NewReplacer("{t}", t, "{l}", l).Replace(sql)
		return colsPlaceholder.ReplaceAllStringFunc(sql, func(m string) string {
			a := colsPlaceholder.FindStringSubmatch(m)
			return recordColumnsOf(a[2], a[3], a[1] == "cols")
		})
	}
	// takeOverLease as in newQueries, with the scope ($SCOPE) in the lease
	// row and in the progress row's update.
	const takeOverLease = `
leased AS (
    INSERT INTO {l} AS l (scope, key_id, fence, locked_at, lease_expires_at,
        holder_instance, holder_host, holder_pid, holder_boot, holder_fence)
    SELECT $SCOPE::text, target.id, target.fence + 1, clock.t, clock.t + $LEASE::bigint * interval '1 microsecond',
        nullif($HOLDER1::text, ''), nullif($HOLDER2::text, ''), nullif($HOLDER3::int, 0), nullif($HOLDER4::text, ''), target.fence + 1
    FROM target, clock
    ON CONFLICT (scope, key_id) DO UPDATE
    SET fence = excluded.fence, locked_at = excluded.locked_at, lease_expires_at = excluded.lease_expires_at,
        holder_instance = excluded.holder_instance, holder_host = excluded.holder_host,
        holder_pid = excluded.holder_pid, holder_boot = excluded.holder_boot, holder_fence = excluded.holder_fence
    WHERE l.locked_at IS NULL OR l.lease_expires_at <= excluded.locked_at
       OR (l.holder_fence = l.fence AND l.holder_instance = excluded.holder_instance AND l.holder_boot <> excluded.holder_boot)
    RETURNING l.*
), taken AS (
    UPDATE {t} k
    SET fence = leased.fence, last_run_at = clock.t, attempts = k.attempts + 1
    FROM leased, clock
    WHERE k.scope = $SCOPE::text AND k.id = leased.key_id
    RETURNING k.*
)`
	lease := func(leaseParam string, holderFirst int, scope string) string {
		return strings.ReplaceAll(holderParams(takeOverLease, leaseParam, holderFirst), "$SCOPE", scope)
	}

	q.takeOver = render(`
WITH clock AS (
    SELECT coalesce($1::timestamptz, now()) AS t
), target AS (
    SELECT k.id, k.fence FROM {t} k
    WHERE k.scope = $12::text AND k.id = $2 AND k.status = 'running' AND k.flow = $3::text AND k.fingerprint = $4
      AND k.method = $6::text AND k.path = $7::text
    FOR NO KEY UPDATE
), ` + lease("$5", 8, "$12") + `
SELECT 'taken_over' AS acquired, clock.t AS db_now, {cols:taken,leased}
FROM taken JOIN leased ON leased.key_id = taken.id, clock`)

	// claimReconcile takes the scope as $2 already. The second branch's
	// NOT EXISTS is correlated with the row (Citus on PostgreSQL 15 refuses
	// the uncorrelated one, a pseudoconstant qual under an outer join).
	q.claimReconcile = render(`
WITH clock AS (
    SELECT coalesce($1::timestamptz, now()) AS t
), target AS (
    SELECT k.id, k.fence FROM {t} k
    WHERE k.scope = $2 AND k.key = $3::text AND k.status = 'needs_reconcile'
    FOR NO KEY UPDATE
), ` + lease("$4", 5, "$2") + `
SELECT 'taken_over' AS acquired, (SELECT t FROM clock) AS db_now, {cols:taken,leased}
FROM taken JOIN leased ON leased.key_id = taken.id
UNION ALL
SELECT 'none', (SELECT t FROM clock), {cols:k,l} FROM {t} k ` + citusLeaseOf(l, "$2") + `
WHERE k.scope = $2 AND k.key = $3::text AND NOT EXISTS (SELECT 1 FROM taken WHERE taken.id = k.id)`)

	// advancePhase and finishPhase: see newQueries. The clock is the
	// statement's start (statement_timestamp(), on the coordinator), not
	// clock_timestamp(), which Citus refuses in an UPDATE; the scope is $6
	// and $12.
	q.advancePhase = render(`
WITH clock AS (
    SELECT coalesce($5::timestamptz, statement_timestamp()) AS t
), guarded AS (
UPDATE {t} k
SET status           = 'running',
    recovery_point   = $3::text,
    checkpoint       = CASE WHEN $4::jsonb = '{}' THEN k.checkpoint ELSE k.checkpoint || $4::jsonb END,
    last_run_at      = clock.t
FROM clock
WHERE k.scope = $6::text AND k.id = $1 AND k.fence = $2
RETURNING 1
)
SELECT 1 / count(*)::int FROM guarded`)

	q.finishPhase = render(`
WITH clock AS (
    SELECT t, t + $7::bigint * interval '1 microsecond' AS expires
    FROM (SELECT coalesce($8::timestamptz, statement_timestamp()) AS t) now
), guarded AS (
UPDATE {t} k
SET status           = 'finished',
    recovery_point   = $10::text,
    checkpoint       = CASE WHEN $3::jsonb = '{}' THEN k.checkpoint ELSE k.checkpoint || $3::jsonb END,
    last_run_at      = clock.t,
    finished_at      = clock.t,
    expires_at       = clock.expires,
    response_status  = $4,
    response_headers = $5::jsonb,
    response_body    = $6,
    response_key_id  = nullif($9::text, ''),
    last_error       = nullif(left($11::text, 4000), '')
FROM clock
WHERE k.scope = $12::text AND k.id = $1 AND k.fence = $2
RETURNING 1
)
SELECT 1 / count(*)::int FROM guarded`)

	q.heartbeat = render(`
WITH clock AS (
    SELECT coalesce($4::timestamptz, now()) + $3::bigint * interval '1 microsecond' AS expires
), beat AS (
    UPDATE {l} l
    SET lease_expires_at = clock.expires
    FROM {t} k, clock
    WHERE l.scope = $5::text AND l.key_id = $1 AND l.fence = $2 AND l.locked_at IS NOT NULL
      AND k.scope = $5::text AND k.id = l.key_id AND k.status <> 'finished'
    RETURNING l.lease_expires_at
)
SELECT lease_expires_at FROM beat`)

	q.release = render(`
WITH released AS (
    UPDATE {t} SET last_error = left($3, 4000)
    WHERE scope = $4::text AND id = $1 AND fence = $2 AND status = 'running'
    RETURNING id
), unlocked AS (
    UPDATE {l} l SET locked_at = NULL, lease_expires_at = NULL
    FROM released WHERE l.scope = $4::text AND l.key_id = released.id AND l.fence = $2
)
SELECT count(*) FROM released`)

	q.setNeedsReconcile = render(`
WITH parked AS (
    UPDATE {t} SET status = 'needs_reconcile', last_error = left($3, 4000)
    WHERE scope = $4::text AND id = $1 AND fence = $2 AND status <> 'finished'
    RETURNING id
), unlocked AS (
    UPDATE {l} l SET locked_at = NULL, lease_expires_at = NULL
    FROM parked WHERE l.scope = $4::text AND l.key_id = parked.id AND l.fence = $2
)
SELECT count(*) FROM parked`)

	q.markForeign = render(`
UPDATE {l} l
SET foreign_mark = $3, foreign_mark_after = k.recovery_point
FROM {t} k
WHERE l.scope = $4::text AND l.key_id = $1 AND l.fence = $2
  AND k.scope = $4::text AND k.id = l.key_id AND k.status = 'running'`)

	q.clearForeignMark = render(`
UPDATE {l} SET foreign_mark = NULL, foreign_mark_after = NULL
WHERE scope = $3::text AND key_id = $1 AND fence = $2`)

	// waitCheck, per key (the checker runs it for each watched key: on
	// Citus there is no statement over many keys that stays on one
	// worker). Waits poll, so nothing marks keys (waitMark is not run).
	q.waitCheck = render(`
SELECT k.status <> 'running' OR k.fence <> $2 OR l.locked_at IS NULL OR l.lease_expires_at <= now() OR l.key_id IS NULL,
       coalesce(extract(epoch FROM l.lease_expires_at - now()), 0)::float8
FROM {t} k LEFT JOIN {l} l ON l.scope = $3::text AND l.key_id = k.id
WHERE k.scope = $3::text AND k.id = $1`)

	q.getKey = render(`SELECT {cols:k,l} FROM {t} k ` + citusLeaseOf(l, "$1") + ` WHERE k.scope = $1 AND k.key = $2::text`)

	// unlockKey takes the scope as $1 already.
	q.unlockKey = render(`
WITH unlocked AS (
    UPDATE {t} k
    SET fence = k.fence + 1, last_error = left($3, 4000)
    WHERE k.scope = $1 AND k.key = $2::text AND k.status <> 'finished'
    RETURNING k.*
), leased AS (
    INSERT INTO {l} AS l (scope, key_id, fence)
    SELECT scope, id, fence FROM unlocked
    ON CONFLICT (scope, key_id) DO UPDATE SET fence = excluded.fence, locked_at = NULL, lease_expires_at = NULL
    RETURNING l.*
)
SELECT true AS unlocked, {cols:unlocked,leased} FROM unlocked JOIN leased ON leased.key_id = unlocked.id
UNION ALL
SELECT false, {cols:k,l} FROM {t} k ` + citusLeaseOf(l, "$1") + `
WHERE k.scope = $1 AND k.key = $2::text AND NOT EXISTS (SELECT 1 FROM unlocked WHERE unlocked.id = k.id)`)

	// claimIdleCandidates is claimIdle's read, over every shard and without
	// a lock; claimIdleOne claims one candidate (scope $1, id $2) if it is
	// still as read: the same fence ($3) and the same last run ($4), which
	// every phase commit, takeover and claim moves. The update re-checks
	// them on the row's newest version under its lock, so of two claimers
	// one gets the key, the other no row.
	q.claimIdle = render(`
WITH clock AS (
    SELECT coalesce($1::timestamptz, now()) AS t
)
SELECT k.scope, k.id, k.fence, k.last_run_at, c.t
FROM {t} k CROSS JOIN clock c LEFT JOIN {l} l ON l.scope = k.scope AND l.key_id = k.id
WHERE k.status <> 'finished' AND k.status = $2::text AND k.flow = ANY($3::text[])
  AND (((l.locked_at IS NULL OR l.lease_expires_at <= c.t)
        AND k.last_run_at <= c.t - $4::bigint * interval '1 microsecond')
       OR (l.locked_at IS NOT NULL AND l.holder_fence = l.fence
           AND l.holder_instance = nullif($7::text, '') AND l.holder_boot <> $8::text))
  AND ($5::int <= 0 OR k.attempts < $5::int)
ORDER BY k.last_run_at
LIMIT $6`)
	q.claimIdleOne = render(`
WITH claimed AS (
    UPDATE {t} k
    SET last_run_at = $5::timestamptz
    WHERE k.scope = $1::text AND k.id = $2 AND k.fence = $3 AND k.last_run_at = $4::timestamptz
      AND k.status <> 'finished'
    RETURNING k.*
)
SELECT {meta:claimed,l} FROM claimed LEFT JOIN {l} l ON l.scope = $1::text AND l.key_id = claimed.id`)

	// reap reads a batch of expired keys (scope, id) from every shard, with
	// the clock it used; reapOne deletes them ($1 scopes, $2 ids, $3 that
	// clock), the conditions re-checked under the row locks: a key two
	// reapers both read is deleted once.
	q.reap = render(`
WITH clock AS (
    SELECT coalesce($1::timestamptz, now()) AS t
)
SELECT k.scope, k.id, c.t FROM {t} k, clock c
WHERE k.status = 'finished' AND k.expires_at <= c.t
ORDER BY k.expires_at
LIMIT $2`)
	q.reapDelete = render(`
DELETE FROM {t}
WHERE scope = ANY($1::text[]) AND id = ANY($2::bigint[]) AND status = 'finished' AND expires_at <= $3::timestamptz`)

	// reapAbandoned reads candidates from every shard without a lock
	// (scope, id, fence, clock); reapAbandonedOne ends one (scope $1, id $2,
	// fence $3, clock $4) in a router statement that locks both rows and
	// re-checks that nobody holds it, as the plain statement does.
	q.reapAbandoned = render(`
WITH clock AS (
    SELECT coalesce($1::timestamptz, now()) AS t
)
SELECT k.scope, k.id, k.fence, c.t
FROM {t} k
JOIN {l} l ON l.scope = k.scope AND l.key_id = k.id
CROSS JOIN clock c
LEFT JOIN unnest($3::text[], $4::bigint[]) AS f(flow, age) ON f.flow = k.flow
WHERE k.status <> 'finished' AND k.status = 'running'
  AND (l.locked_at IS NULL OR l.lease_expires_at <= c.t)
  AND coalesce(f.age, $2::bigint) >= 0
  AND k.created_at <= c.t - coalesce(f.age, $2::bigint) * interval '1 microsecond'
ORDER BY k.id
LIMIT $5`)
	q.reapAbandonedOne = render(`
WITH candidate AS MATERIALIZED (
    SELECT k.id, (l.foreign_mark IS NOT NULL AND l.foreign_mark_after = k.recovery_point) AS marked
    FROM {t} k JOIN {l} l ON l.scope = $1::text AND l.key_id = k.id
    WHERE k.scope = $1::text AND k.id = $2 AND k.fence = $3 AND k.status = 'running'
      AND (l.locked_at IS NULL OR l.lease_expires_at <= $4::timestamptz)
    FOR UPDATE OF k, l
), parked AS (
    UPDATE {t}
    SET status = 'needs_reconcile',
        last_error = 'abandoned past its AbandonAfter with a not-idempotent call in doubt; a reconcile run decides'
    WHERE scope = $1::text AND id IN (SELECT id FROM candidate WHERE marked)
    RETURNING 1
), deleted AS (
    DELETE FROM {t}
    WHERE scope = $1::text AND id IN (SELECT id FROM candidate WHERE NOT marked)
    RETURNING 1
)
SELECT (SELECT count(*) FROM deleted), (SELECT count(*) FROM parked)`)

	q.unfinishedKeys = render(`
SELECT k.flow::text AS flow, k.recovery_point::text AS recovery_point,
       CASE WHEN l.foreign_mark_after = k.recovery_point THEN coalesce(l.foreign_mark, '') ELSE '' END AS mark,
       k.status::text AS status, count(*)::int AS keys
FROM {t} k LEFT JOIN {l} l ON l.scope = k.scope AND l.key_id = k.id
WHERE k.status <> 'finished' AND k.flow = ANY($1::text[])
GROUP BY 1, 2, 3, 4
ORDER BY 1, 2, 3, 4`)
}

// claimIdleCitus is ClaimIdle on Citus: the candidates, then a claim of each.
func (s *Store) claimIdleCitus(ctx context.Context, p idemdriver.ClaimIdleParams) ([]*idemdriver.KeyRecord, error) {
	rows, err := s.db.Query(ctx, s.q.claimIdle,
		p.Now, string(p.Status), p.Flows, p.IdleFor.Microseconds(), p.MaxAttempts, p.Limit, s.holder.instance, s.holder.boot)
	if err != nil {
		return nil, mapError(fmt.Errorf("pgstore: claim idle keys: %w", err))
	}
	type candidate struct {
		scope          string
		id, fence      int64
		lastRun, clock time.Time
	}
	var cands []candidate
	for rows.Next() {
		var c candidate
		if err := rows.Scan(&c.scope, &c.id, &c.fence, &c.lastRun, &c.clock); err != nil {
			rows.Close()
			return nil, mapError(fmt.Errorf("pgstore: claim idle keys: %w", err))
		}
		cands = append(cands, c)
	}
	if err := rows.Err(); err != nil {
		return nil, mapError(fmt.Errorf("pgstore: claim idle keys: %w", err))
	}
	var recs []*idemdriver.KeyRecord
	for _, c := range cands {
		var rec idemdriver.KeyRecord
		err := s.db.QueryRow(ctx, s.q.claimIdleOne, c.scope, c.id, c.fence, c.lastRun, c.clock).Scan(recordDest(&rec)...)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue // another claimer, or the key's own worker, moved it
		case err != nil:
			return recs, mapError(fmt.Errorf("pgstore: claim idle key: %w", err))
		}
		withoutPayload(&rec)
		recs = append(recs, &rec)
	}
	return recs, nil
}

// reapCitus is Reap on Citus: one batch read, then deleted in one
// statement (on the shards of the batch's scopes).
func (s *Store) reapCitus(ctx context.Context, p idemdriver.ReapParams) (int, error) {
	var deleted int
	err := s.inBatchTx(ctx, "reap", p.StatementTimeout, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.q.reap, p.Now, p.Limit)
		if err != nil {
			return err
		}
		var (
			scopes []string
			ids    []int64
			clock  time.Time
		)
		for rows.Next() {
			var scope string
			var id int64
			if err := rows.Scan(&scope, &id, &clock); err != nil {
				rows.Close()
				return err
			}
			scopes, ids = append(scopes, scope), append(ids, id)
		}
		if err := rows.Err(); err != nil || len(ids) == 0 {
			return err
		}
		tag, err := tx.Exec(ctx, s.q.reapDelete, scopes, ids, clock)
		deleted = int(tag.RowsAffected())
		return err
	})
	return deleted, err
}

// reapAbandonedCitus is ReapAbandoned on Citus: candidates, then each ended
// by a router statement of its own, so that a key another reaper (or a
// takeover) got to first is left alone.
func (s *Store) reapAbandonedCitus(ctx context.Context, p idemdriver.ReapAbandonedParams, after int64, flows []string, ages []int64) (idemdriver.ReapAbandonedResult, error) {
	var res idemdriver.ReapAbandonedResult
	type candidate struct {
		scope     string
		id, fence int64
		clock     time.Time
	}
	var cands []candidate
	err := s.inBatchTx(ctx, "reap abandoned keys", p.StatementTimeout, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.q.reapAbandoned, p.Now, after, flows, ages, p.Limit)
		if err != nil {
			return err
		}
		for rows.Next() {
			var c candidate
			if err := rows.Scan(&c.scope, &c.id, &c.fence, &c.clock); err != nil {
				rows.Close()
				return err
			}
			cands = append(cands, c)
		}
		return rows.Err()
	})
	if err != nil {
		return res, err
	}
	for _, c := range cands {
		var deleted, parked int
		err := s.inBatchTx(ctx, "reap abandoned key", p.StatementTimeout, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, s.q.reapAbandonedOne, c.scope, c.id, c.fence, c.clock).Scan(&deleted, &parked)
		})
		if err != nil {
			return res, err
		}
		res.Deleted += deleted
		res.NeedsReconcile += parked
	}
	return res, nil
}

// checkAllWaitedCitus is checkAllWaited on Citus: one router statement per
// key. A key whose check fails (its worker is down, say) is left out of the
// results, to be checked again later, and does not keep the others, whose
// workers answer, from being woken; the error is returned only when no key
// could be checked.
func (s *Store) checkAllWaitedCitus(ctx context.Context, refs []idemdriver.LockRef) (map[int64]waitState, error) {
	out := make(map[int64]waitState, len(refs))
	var first error
	for _, ref := range refs {
		over, left, err := s.checkWaited(ctx, ref)
		if errors.Is(err, pgx.ErrNoRows) {
			out[ref.ID] = waitState{over: true}
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return out, err
			}
			first = cmp.Or(first, err)
			continue
		}
		out[ref.ID] = waitState{over: over, left: left}
	}
	if len(out) == 0 && first != nil {
		return out, first
	}
	return out, nil
}

// useCitus switches the store to the Citus statements, and its waits to
// polling: migration 0010's notifications would come from the workers,
// where nobody listens.
func (s *Store) useCitus() {
	s.q.useCitus()
	s.waits.mu.Lock()
	s.waits.conn = nil
	s.waits.mu.Unlock()
}
