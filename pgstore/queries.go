package pgstore

import (
	"cmp"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
)

// queries holds every statement of the store, rendered once for the
// configured schema.
//
// A key is its progress row in idem_keys (the request, the recovery point,
// checkpoint data, the response, the fence and the key's first lease) and,
// once something writes its lease, its lease row in idem_leases (the lease
// and the foreign mark, with a copy of the fence), which from then on holds
// the lease (leaseCol). A phase's guarded commit updates only the progress
// row; heartbeats and foreign marks write only the lease row (making it from
// the progress row, which they read and never lock), so under repeatable
// read and serializable they never make the row the commit updates newer
// than the phase's snapshot. Statements that move the fence (takeover,
// reconcile claims, forced unlocks) write both rows, the progress row first:
// every statement that locks both locks them in that order.
//
// Conventions: every statement about one key names its scope, the
// distribution column on Citus, on every table it reads or writes, as its
// last parameter, so that it runs unchanged on plain
// PostgreSQL and, sent whole to the one worker that holds the scope, on
// Citus. What Citus refuses, and what the statements do instead, on both:
//
//   - an UPDATE on a distributed table may not call a VOLATILE function
//     (clock_timestamp()), nor a non-IMMUTABLE one inside CASE or COALESCE
//     (coalesce($now, now())), nor a STABLE one over a column (clock.t +
//     interval, timestamptz arithmetic being STABLE): the clock, and what
//     is computed from it, is computed in a CTE (clock) that the UPDATE
//     joins, statement_timestamp() for clock_timestamp();
//   - a lease row is joined with an explicit l.scope (leaseOf): a join to
//     k.scope alone is not carried through a LATERAL subquery;
//   - SELECT ... FOR UPDATE runs only in router queries: on Citus the
//     completer's and the reaper's batches are read without locks from
//     every shard, then claimed key by key (citus.go), the one branch.
//
// $now parameters are nullable timestamptz; NULL means the database clock,
// a value is a test's injected clock. Durations travel as bigint
// microseconds. Every statement that touches a held key is guarded by its
// fence: "scope = $s AND id = $1 AND fence = $2" on the progress row, or
// "scope = $s AND key_id = $1 AND fence = $2" on the lease row.
type queries struct {
	table, leases string

	acquire, insertOrReport, lookUp string
	takeOver, claimReconcile        string
	advancePhase, finishPhase       string
	withdrawPhase                   string
	heartbeat, release              string
	markForeign, clearForeignMark   string
	setNeedsReconcile, getKey       string
	// The same without waking waiters, for Citus (forCitus).
	finishPhaseQuiet, setNeedsReconcileQuiet string
	waitMark, waitCheck                      string
	notifyWaiters, waitCheckAll              string

	unlockKey, claimIdle, reap, reapAbandoned, unfinishedKeys, statementTimeout, clock string
	backlog, resetStatementTimeout, localStatementTimeout                              string

	// citus says the tables are distributed by Citus (New asks): the claim
	// loops then claim key by key (citus.go), and waits poll.
	citus                                                         bool
	claimIdleCandidates, claimIdleOne, reapCandidates, reapDelete string
	reapAbandonedCandidates, reapAbandonedOne                     string

	// leaseRowsAbandoned and leaseRowOf make the lease rows of keys that
	// have none (see leaseRow), before a statement that must lock them.
	leaseRowsAbandoned, leaseRowOf string

	// The sweep (sweep.go).
	sweepState, sweepEnsure, sweepClaim, sweepChunkEnd, sweepList, sweepPass, sweepForget, sweepMove string
}

// recordColumns renders the columns of idemtype.KeyRecord from a progress
// row alias k and a lease row alias l (NULL when the key has no lease row),
// mapping NULLs of text and int columns to zero values. The columns of
// domain types (migration 0006) are read as text, as idem_acquire returns
// them. A finished key shows
// no lease and no mark, and a mark shows only while the key is still at the
// recovery point it was made at (see the migration that made idem_leases).
func recordColumns(k, l string) string { return recordColumnsOf(k, l, allColumns) }

// columnSet says which of recordColumns a statement reads.
type columnSet int

const (
	allColumns columnSet = iota
	// metaColumns: the payload columns (params, checkpoint, response
	// headers and body) are NULL instead of read, for listings and claims
	// that do not show them: they can be large.
	metaColumns
	// foundColumns: what an acquisition returns of a key it found; a
	// finished key's params and checkpoint are NULL (a replay needs
	// neither).
	foundColumns
)

// recordColumnsOf is recordColumns with the columns of set.
func recordColumnsOf(k, l string, set columnSet) string {
	cols := `{k}id, {k}scope, {k}key::text AS key,
		{k}flow::text AS flow, {k}method::text AS method, {k}path::text AS path,
		{k}fingerprint, {k}params, {k}status::text AS status, {k}recovery_point::text AS recovery_point, {k}checkpoint,
		CASE WHEN {k}status <> 'finished' AND {l}foreign_mark_after = {k}recovery_point
		     THEN coalesce({l}foreign_mark, '') ELSE '' END AS foreign_mark,
		CASE WHEN {k}status <> 'finished' THEN {lease:locked_at} END AS locked_at,
		CASE WHEN {k}status <> 'finished' THEN {lease:lease_expires_at} END AS lease_expires_at, {k}fence,
		coalesce({k}response_status, 0) AS response_status, coalesce({k}response_headers, '{}') AS response_headers,
		{k}response_body, {k}attempts, coalesce({k}last_error, '') AS last_error,
		{k}created_at, {k}last_run_at, {k}finished_at, {k}expires_at,
		coalesce({k}params_key_id, '') AS params_key_id, coalesce({k}response_key_id, '') AS response_key_id,
		{k}generation,
		CASE WHEN {k}status <> 'finished' AND {holder} THEN coalesce({lease:holder_instance}, '') ELSE '' END AS holder_instance,
		CASE WHEN {k}status <> 'finished' AND {holder} THEN coalesce({lease:holder_host}, '') ELSE '' END AS holder_host,
		CASE WHEN {k}status <> 'finished' AND {holder} THEN coalesce({lease:holder_pid}, 0) ELSE 0 END AS holder_pid,
		CASE WHEN {k}status <> 'finished' AND {holder} THEN coalesce({lease:holder_boot}, '') ELSE '' END AS holder_boot`
	switch set {
	case metaColumns:
		cols = strings.NewReplacer("{k}params,", "NULL::jsonb AS params,", "{k}checkpoint,", "NULL::jsonb AS checkpoint,",
			"coalesce({k}response_headers, '{}')", "NULL::jsonb", "{k}response_body,", "NULL::bytea AS response_body,").Replace(cols)
	case foundColumns:
		cols = strings.NewReplacer(
			"{k}params,", "CASE WHEN {k}status <> 'finished' THEN {k}params END AS params,",
			"{k}checkpoint,", "CASE WHEN {k}status <> 'finished' THEN {k}checkpoint END AS checkpoint,").Replace(cols)
	}
	cols = leasePlaceholder.ReplaceAllStringFunc(cols, func(m string) string {
		return leaseCol(k, l, leasePlaceholder.FindStringSubmatch(m)[1])
	})
	cols = strings.ReplaceAll(cols, "{holder}", "("+l+".key_id IS NULL OR "+l+".holder_fence = "+l+".fence)")
	return strings.NewReplacer("{k}", k+".", "{l}", l+".").Replace(cols)
}

// leaseCol is column col of a key's lease as its readers read it, k the
// progress row and l its lease row (NULL when the key has none): the lease
// row's when it exists, else the first lease the key row carries (see
// idem_keys in migration 0007). A key's lease row, once made, holds its
// lease for good; until then the key row's first lease is the lease.
func leaseCol(k, l, col string) string {
	return "(CASE WHEN " + l + ".key_id IS NULL THEN " + k + "." + col + " ELSE " + l + "." + col + " END)"
}

// leasePlaceholder is {lease:col} (leaseCol over recordColumns' aliases)
// and, in statements, {lease:k,l,col}.
var (
	leasePlaceholder   = regexp.MustCompile(`\{lease:(\w+)\}`)
	leaseAliasedColumn = regexp.MustCompile(`\{lease:(\w+),(\w+),(\w+)\}`)
)

// recordDest returns the scan destinations of recordColumns, in the same
// order, so the hot paths (acquisition, reconcile claims, GetKey) scan rows
// with pgx directly: scany's reflection costs more per row than the
// acquisition statement itself. Keep the two lists in step; a test checks.
func recordDest(rec *idemtype.KeyRecord) []any {
	return []any{&rec.ID, &rec.Scope, &rec.Key, &rec.Flow, &rec.Method, &rec.Path,
		&rec.Fingerprint, &rec.Params, &rec.Status, &rec.RecoveryPoint, &rec.Checkpoint,
		&rec.ForeignMark, &rec.LockedAt, &rec.LeaseExpiresAt, &rec.Fence,
		&rec.ResponseStatus, &rec.ResponseHeaders,
		&rec.ResponseBody, &rec.Attempts, &rec.LastError,
		&rec.CreatedAt, &rec.LastRunAt, &rec.FinishedAt, &rec.ExpiresAt,
		&rec.ParamsKeyID, &rec.ResponseKeyID, &rec.Generation,
		&rec.HolderInstance, &rec.HolderHost, &rec.HolderPID, &rec.HolderBoot}
}

// leaseOf joins progress rows k with their lease rows l for reading, scope
// being the scope's expression (a parameter, or k.scope). A finished key's
// lease row means nothing: recordColumns hides it, and the join condition
// leaves it out.
func leaseOf(leases, scope string) string {
	return `LEFT JOIN ` + leases + ` l ON l.scope = ` + scope + ` AND l.key_id = k.id AND k.status <> 'finished'`
}

// leaseOfFound is leaseOf for the acquisition's report of the one key it
// found, which a replay must not pay a lease read for: as a join condition,
// "k.status <> 'finished'" is checked after the lease row's index scan; in
// a LATERAL subquery kept whole (OFFSET 0 stops the planner from pulling it
// up into a join), it is a one-time filter on the outer row, and the scan
// of a finished key's lease row never runs (TestReplayDoesNotReadTheLeaseRow).
func leaseOfFound(leases, scope string) string {
	return `LEFT JOIN LATERAL (SELECT * FROM ` + leases + ` l WHERE l.scope = ` + scope + ` AND l.key_id = k.id AND k.status <> 'finished' OFFSET 0) l ON true`
}

// colsPlaceholder is {cols:k,l}: recordColumns over aliases k and l;
// {meta:k,l}: the same without the payload (recordColumnsOf); and
// {found:k,l}: what an acquisition returns of a key it found, which is
// recordColumns except for a finished key's params and checkpoint (NULL: a
// replay needs neither, and they can be large).
var colsPlaceholder = regexp.MustCompile(`\{(cols|meta|found):(\w+),(\w+)\}`)

// holderParams renders takeOverLease with the lease parameter and the
// holder's four (see holderArgs) numbered from first.
func holderParams(sql, lease string, first int) string {
	r := []string{"$LEASE", lease}
	for i := 1; i <= 4; i++ {
		r = append(r, fmt.Sprintf("$HOLDER%d", i), fmt.Sprintf("$%d", first+i-1))
	}
	return strings.NewReplacer(r...).Replace(sql)
}

func newQueries(prefix string) *queries {
	t, l := prefix+"idem_keys", prefix+"idem_leases"
	q := &queries{table: t, leases: l}
	render := func(sql string) string {
		sql = strings.NewReplacer("{t}", t, "{l}", l, "{notify}", prefix+"idem_notify_waiters",
			"{stragglers}", prefix+"idem_stragglers", "{sweep}", prefix+"idem_sweep").Replace(sql)
		sql = leaseAliasedColumn.ReplaceAllStringFunc(sql, func(m string) string {
			a := leaseAliasedColumn.FindStringSubmatch(m)
			return leaseCol(a[1], a[2], a[3])
		})
		return colsPlaceholder.ReplaceAllStringFunc(sql, func(m string) string {
			a := colsPlaceholder.FindStringSubmatch(m)
			return recordColumnsOf(a[2], a[3], map[string]columnSet{"cols": allColumns, "meta": metaColumns, "found": foundColumns}[a[1]])
		})
	}

	// acquire: one statement, one round trip, for a new key, a replay and an
	// in-progress key alike: the PL/pgSQL function idem_acquire
	// (migrations/sql/0007_v02_format.up.sql, which says what it does). It
	// returns (acquired, db_now, recordColumns), except that a finished key
	// comes back without its params and checkpoint, which a replay does not
	// need. TestAcquireFunctionMatchesRecordColumns holds the function to
	// recordColumns: a change to one needs a migration that replaces the
	// function (CREATE OR REPLACE, the same name).
	//
	// Replays and in-progress answers write nothing: no transaction id, no
	// WAL, no row lock. Zero rows come back when NoCreate finds nothing live
	// and, rarely, when the key the insert lost to is no longer live when the
	// function reads it again; a serialization failure, under a server
	// default of repeatable read or serializable, when a concurrent acquirer
	// inserted or replaced the key since the snapshot. In the last two cases
	// the caller (Store.Acquire) calls again, and the new snapshot sees what
	// the other did.
	//
	// Taking over an abandoned key is a second statement (takeOver), sent
	// only when the key looks takeable: keeping an UPDATE out of this one
	// spares every replay the cost of setting one up, and takeovers are rare.
	//
	// Params travel as text (a Go string: []byte would be sent as bytea in
	// the exec and simple_protocol modes): the function parses them only
	// when it inserts.
	q.acquire = `SELECT * FROM ` + prefix + `idem_acquire($1::timestamptz, $2::text, $3::text, $4::text, $5::text, $6::text,
    $7::bytea, $8::text, $9::bigint, $10::boolean, $11::text, $12::text, $13::text, $14::int, $15::text, $16::bigint)`

	// insertOrReport and lookUp are the acquisition in plain SQL, one
	// statement each, with idem_acquire's columns and outcomes; Store.Acquire
	// sends one of them first (see acquirer) and falls back to idem_acquire
	// for what they leave to it.
	//
	// insertOrReport inserts the key, locked by the first lease on its row
	// (no lease row), or reports the live key that is there: one round trip
	// for a new key, a replay and a key in progress alike. ON CONFLICT DO
	// NOTHING turns a concurrent insert into "nothing inserted", never a
	// unique violation. No row comes back when the key there is expired
	// (idem_acquire replaces it, one generation on) or when the key the
	// insert met was committed after the statement's snapshot (a race the
	// function's next read sees). Its parameters are idem_acquire's without
	// p_no_create.
	q.insertOrReport = render(`
WITH clock AS (
    SELECT coalesce($1::timestamptz, now()) AS t
), ins AS (
    INSERT INTO {t} AS k (scope, key, flow, method, path, fingerprint, params, created_at, reap_after, last_run_at,
        params_key_id, locked_at, lease_expires_at, holder_instance, holder_host, holder_pid, holder_boot)
    SELECT $2::text, $3::text, $4::text, $5::text, $6::text, $7::bytea, $8::text::jsonb, c.t,
        c.t + $15::bigint * interval '1 microsecond', c.t, nullif($10::text, ''),
        c.t, c.t + $9::bigint * interval '1 microsecond',
        nullif($11::text, ''), nullif($12::text, ''), nullif($13::int, 0), nullif($14::text, '')
    FROM clock c
    ON CONFLICT ON CONSTRAINT idem_keys_scope_key DO NOTHING
    RETURNING k.*
)
SELECT 'created' AS acquired, c.t AS db_now, {found:k,l}
FROM ins k CROSS JOIN clock c LEFT JOIN {l} l ON false
UNION ALL
SELECT 'none', c.t, {found:k,l}
FROM {t} k CROSS JOIN clock c ` + leaseOfFound(l, "$2::text") + `
WHERE k.scope = $2::text AND k.key = $3::text AND NOT (k.status = 'finished' AND k.expires_at <= c.t)
  AND NOT EXISTS (SELECT 1 FROM ins)`)

	// lookUp reports the live key (scope $2, key $3, clock $1) as
	// insertOrReport does, and inserts nothing: the cheapest replay, with no
	// insert to set up; no row when there is no live key.
	q.lookUp = render(`
WITH clock AS (
    SELECT coalesce($1::timestamptz, now()) AS t
)
SELECT 'none' AS acquired, c.t AS db_now, {found:k,l}
FROM {t} k CROSS JOIN clock c ` + leaseOfFound(l, "$2::text") + `
WHERE k.scope = $2::text AND k.key = $3::text AND NOT (k.status = 'finished' AND k.expires_at <= c.t)`)

	// takeOverLease is the part of takeOver and claimReconcile that takes
	// the lease. target is the progress row, already locked as an UPDATE
	// locks it (FOR NO KEY UPDATE, which does not wait for a phase whose
	// rows reference the key), so its conditions held on its newest version.
	// The upsert then locks the lease row and checks that nobody holds it on
	// the lease row's newest version, after any heartbeat or mark in flight:
	// of two workers racing for one key, the second finds the lease just
	// taken and gets no row, and a mark made meanwhile comes back with the
	// row. Only then does taken move the progress row's fence. A key that
	// lost its lease row gets one.
	//
	// The lease names its new holder ($HOLDER: instance, host, pid, boot; see
	// holderArgs) at its new fence. A live lease is taken too when its holder
	// is an earlier process of this store's instance (same instance name,
	// another boot, recorded at the lease's fence): that process is dead,
	// since an instance name is unique among live processes, and the new
	// fence fails any statement it would still send. $SCOPE is the key's
	// scope.
	const takeOverLease = `
leased AS (
    INSERT INTO {l} AS l (scope, key_id, fence, locked_at, lease_expires_at,
        holder_instance, holder_host, holder_pid, holder_boot, holder_fence)
    SELECT $SCOPE::text, target.id, target.fence + 1, clock.t, clock.t + $LEASE::bigint * interval '1 microsecond',
        nullif($HOLDER1::text, ''), nullif($HOLDER2::text, ''), nullif($HOLDER3::int, 0), nullif($HOLDER4::text, ''), target.fence + 1
    FROM target, clock
    WHERE EXISTS (SELECT 1 FROM {l} x WHERE x.scope = $SCOPE::text AND x.key_id = target.id)
       OR target.locked_at IS NULL OR target.lease_expires_at <= clock.t
       OR (target.holder_instance = nullif($HOLDER1::text, '') AND target.holder_boot <> $HOLDER4::text)
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

	// takeOver locks an unfinished key of the same flow, method and path
	// that nobody holds (unlocked, or lease expired), with a new fence on
	// both of its rows. Its fingerprint parameter is the key's own, as read
	// (Acquire decides it is this request by KeyRecord.SameRequest): it
	// only checks that the row is still the one read.
	q.takeOver = render(`
WITH clock AS (
    SELECT coalesce($1::timestamptz, now()) AS t
), target AS (
    SELECT k.id, k.fence, k.locked_at, k.lease_expires_at, k.holder_instance, k.holder_boot FROM {t} k
    WHERE k.scope = $12::text AND k.id = $2 AND k.status = 'running' AND k.flow = $3::text AND k.fingerprint = $4
      AND k.method = $6::text AND k.path = $7::text
    FOR NO KEY UPDATE
), ` + lease("$5", 8, "$12") + `
SELECT 'taken_over' AS acquired, clock.t AS db_now, {cols:taken,leased}
FROM taken JOIN leased ON leased.key_id = taken.id, clock`)

	q.claimReconcile = render(`
WITH clock AS (
    SELECT coalesce($1::timestamptz, now()) AS t
), target AS (
    SELECT k.id, k.fence, k.locked_at, k.lease_expires_at, k.holder_instance, k.holder_boot FROM {t} k
    WHERE k.scope = $2 AND k.key = $3::text AND k.status = 'needs_reconcile'
    FOR NO KEY UPDATE
), ` + lease("$4", 5, "$2") + `
SELECT 'taken_over' AS acquired, (SELECT t FROM clock) AS db_now, {cols:taken,leased}
FROM taken JOIN leased ON leased.key_id = taken.id
UNION ALL
SELECT 'none', (SELECT t FROM clock), {cols:k,l} FROM {t} k ` + leaseOf(l, "$2") + `
WHERE k.scope = $2 AND k.key = $3::text AND NOT EXISTS (SELECT 1 FROM taken WHERE taken.id = k.id)`)

	// advancePhase and finishPhase record a phase's commit on its key. They
	// run inside the phase's transaction, pipelined with its COMMIT
	// (phaseTx.commitGuarded). A moved fence must therefore fail the
	// statement, not merely match no row, or the COMMIT behind it would
	// commit a taken-over worker's writes: dividing by the count of updated
	// rows raises division_by_zero (22012) exactly when the guard matched
	// nothing, and nothing else in the statements can divide.
	//
	// They update the progress row only (withdrawPhase, below, the lease
	// row too, for a resolve, which no heartbeat runs beside). Its newest version is the one this
	// worker's acquisition or previous commit wrote, unless a takeover or a
	// forced unlock moved the fence since; so at repeatable read and
	// serializable the update conflicts exactly when the fence moved, and
	// the retry then finds it moved. The lease is not renewed here: that
	// is the heartbeat's work, on the lease row. A foreign mark is not
	// cleared here either: moving the recovery point retires it.
	//
	// They write no indexed column while the key stays running, so an
	// advance is a HOT update. statement_timestamp(), not now(): now() is
	// when the transaction began.
	//
	// finishPhase, release and setNeedsReconcile end an attempt: they wake
	// the key's waiters, on every instance, when a waiter marked it
	// (waitMark), at commit. finishPhase and setNeedsReconcile call
	// idem_notify_waiters themselves (wakeWaiters), only for the key they
	// matched; release's lease update fires a trigger (0007), which checks
	// for a mark before it calls anything. No trigger runs on a finish.
	// withdrawPhase is advancePhase that also withdraws the foreign mark,
	// progress row first, for a commit that leaves the recovery point
	// where the mark was made (CommitParams.ClearForeignMark).
	advance := `
WITH clock AS (
    SELECT coalesce($5::timestamptz, statement_timestamp()) AS t
), guarded AS (
UPDATE {t} k
SET status           = 'running',
    recovery_point   = $3::text,
    checkpoint       = CASE WHEN $4::jsonb = '{}' THEN k.checkpoint ELSE k.checkpoint || $4::jsonb END,
    last_run_at      = clock.t
FROM clock
WHERE k.scope = $6::text AND k.id = $1 AND k.fence = $2 AND k.status <> 'finished'
RETURNING k.id
)%s
SELECT 1 / count(*)::int FROM guarded`
	q.advancePhase = render(fmt.Sprintf(advance, ""))
	q.withdrawPhase = render(fmt.Sprintf(advance, `, withdrawn AS (
    UPDATE {l} l SET foreign_mark = NULL, foreign_mark_after = NULL
    FROM guarded WHERE l.scope = $6::text AND l.key_id = guarded.id AND l.fence = $2
)`))

	finishPhase := `
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
    -- Unchanged, and so still a HOT update, unless the retention is now
    -- shorter than the acquisition's: then the key expires sooner than
    -- its reap_after said, and the reaper must reach it by then.
    reap_after       = least(k.reap_after, clock.expires),
    response_status  = $4,
    response_headers = $5::jsonb,
    response_body    = $6,
    response_key_id  = nullif($9::text, ''),
    last_error       = nullif(left($11::text, 4000), '')
FROM clock
WHERE k.scope = $12::text AND k.id = $1 AND k.fence = $2
RETURNING k.id
)
SELECT 1 / count(*)::int FROM guarded`
	q.finishPhase = render(finishPhase + wakeWaiters("$12", "guarded"))
	q.finishPhaseQuiet = render(finishPhase)

	q.heartbeat = render(`
INSERT INTO {l} AS l (scope, key_id, fence, locked_at, lease_expires_at,
    holder_instance, holder_host, holder_pid, holder_boot, holder_fence)
SELECT k.scope, k.id, k.fence, k.locked_at, coalesce($4::timestamptz, now()) + $3::bigint * interval '1 microsecond',
    k.holder_instance, k.holder_host, k.holder_pid, k.holder_boot, k.fence
FROM {t} k
WHERE k.scope = $5::text AND k.id = $1 AND k.fence = $2 AND k.status <> 'finished' AND k.locked_at IS NOT NULL
ON CONFLICT (scope, key_id) DO UPDATE SET lease_expires_at = excluded.lease_expires_at
WHERE l.fence = excluded.fence AND l.locked_at IS NOT NULL
RETURNING l.lease_expires_at`)

	// release and setNeedsReconcile are guarded on the progress row, which
	// they lock first, and unlock the lease: the first lease on the key row
	// and the lease row, made unlocked if the key has none. An upsert, not
	// an UPDATE of the lease rows the statement's snapshot sees: a waiter's
	// mark or a heartbeat may make the lease row, locked, after that
	// snapshot (the mark's lock on the progress row is what the statement
	// waited for), and the conflict meets it on its newest version. They
	// return how many keys the guard matched.
	q.release = render(`
WITH released AS (
    UPDATE {t} SET last_error = left($3, 4000), locked_at = NULL, lease_expires_at = NULL
    WHERE scope = $4::text AND id = $1 AND fence = $2 AND status = 'running'
    RETURNING id
), unlocked AS (
    INSERT INTO {l} AS l (scope, key_id, fence)
    SELECT $4::text, released.id, $2 FROM released
    ON CONFLICT (scope, key_id) DO UPDATE SET locked_at = NULL, lease_expires_at = NULL
    WHERE l.fence = excluded.fence
)
SELECT count(*) FROM released`)

	setNeedsReconcile := `
WITH parked AS (
    UPDATE {t} SET status = 'needs_reconcile', last_error = left($3, 4000), locked_at = NULL, lease_expires_at = NULL
    WHERE scope = $4::text AND id = $1 AND fence = $2 AND status <> 'finished'
    RETURNING id
), unlocked AS (
    INSERT INTO {l} AS l (scope, key_id, fence)
    SELECT $4::text, parked.id, $2 FROM parked
    ON CONFLICT (scope, key_id) DO UPDATE SET locked_at = NULL, lease_expires_at = NULL
    WHERE l.fence = excluded.fence
)
SELECT count(*) FROM parked`
	q.setNeedsReconcile = render(setNeedsReconcile + wakeWaiters("$4", "parked"))
	q.setNeedsReconcileQuiet = render(setNeedsReconcile)

	// markForeign records the mark with the recovery point it is made at;
	// the phase's commit moves the recovery point and so retires the mark
	// without writing the lease row.
	q.markForeign = render(`
INSERT INTO {l} AS l (scope, key_id, fence, locked_at, lease_expires_at,
    holder_instance, holder_host, holder_pid, holder_boot, holder_fence, foreign_mark, foreign_mark_after)
SELECT k.scope, k.id, k.fence, k.locked_at, k.lease_expires_at,
    k.holder_instance, k.holder_host, k.holder_pid, k.holder_boot, k.fence, $3, k.recovery_point
FROM {t} k
WHERE k.scope = $4::text AND k.id = $1 AND k.fence = $2 AND k.status = 'running'
ON CONFLICT (scope, key_id) DO UPDATE SET foreign_mark = excluded.foreign_mark, foreign_mark_after = excluded.foreign_mark_after
WHERE l.fence = excluded.fence`)

	q.clearForeignMark = render(`
UPDATE {l} SET foreign_mark = NULL, foreign_mark_after = NULL
WHERE scope = $3::text AND key_id = $1 AND fence = $2`)

	// waitMark marks a key that a process starts waiting for, so that the
	// statement that ends its attempt notifies (wakeWaiters, the trigger of 0007),
	// and reports the key as waitCheck does. It locks the progress row FOR
	// SHARE, which conflicts with the finishing update: a mark either
	// commits before that update takes the row (the finishing statement,
	// at read committed, then sees it: it waits for the row, and the
	// function reads with a snapshot of its own) or waits for the finish
	// to commit and reports the key finished. The mark is written once per
	// key (waited_at IS NULL), on the lease row, which phase commits never
	// write. Run at read committed (Store.markWaited), and followed by
	// waitCheck: what it reports of the lease row is of its snapshot, which
	// predates a release it waited for.
	q.waitMark = render(`
WITH k AS (
    SELECT id, status, fence, locked_at, lease_expires_at, holder_instance, holder_host, holder_pid, holder_boot
    FROM {t} WHERE scope = $3::text AND id = $1 FOR SHARE
), marked AS (
    INSERT INTO {l} AS l (scope, key_id, fence, locked_at, lease_expires_at,
        holder_instance, holder_host, holder_pid, holder_boot, holder_fence, waited_at)
    SELECT $3::text, k.id, k.fence, k.locked_at, k.lease_expires_at,
        k.holder_instance, k.holder_host, k.holder_pid, k.holder_boot, k.fence, now()
    FROM k WHERE k.status = 'running'
    ON CONFLICT (scope, key_id) DO UPDATE SET waited_at = excluded.waited_at
    WHERE l.waited_at IS NULL
    RETURNING 1
)
SELECT k.status <> 'running' OR k.fence <> $2 OR {lease:k,l,locked_at} IS NULL OR {lease:k,l,lease_expires_at} <= now(),
       coalesce(extract(epoch FROM {lease:k,l,lease_expires_at} - now()), 0)::float8
FROM k LEFT JOIN {l} l ON l.scope = $3::text AND l.key_id = k.id`)

	// waitCheck reports whether a waited-for key's attempt is over (it
	// finished, was parked, released, taken over, or its lease ran out) and
	// how many seconds its lease has left; no row when the key is gone.
	// Store.markWaited runs it after waitMark, in the same read-committed
	// transaction: its snapshot, newer than the mark's, sees a release that
	// committed while the mark waited for the progress row's lock (the
	// mark's own statement read the lease row from its older snapshot, and
	// the release notified nobody, the key not being marked yet).
	q.waitCheck = render(`
SELECT k.status <> 'running' OR k.fence <> $2 OR {lease:k,l,locked_at} IS NULL OR {lease:k,l,lease_expires_at} <= now(),
       coalesce(extract(epoch FROM {lease:k,l,lease_expires_at} - now()), 0)::float8
FROM {t} k LEFT JOIN {l} l ON l.scope = $3::text AND l.key_id = k.id
WHERE k.scope = $3::text AND k.id = $1`)

	// waitCheckAll is waitCheck for every key a process's watches check at
	// one tick, in one statement: one row per (id, fence, scope), over true
	// for a key that is gone. (On Citus the checker runs waitCheck per key
	// instead: no statement over many keys stays on one worker.)
	q.waitCheckAll = render(`
SELECT w.id,
       k.id IS NULL OR k.status <> 'running' OR k.fence <> w.fence OR {lease:k,l,locked_at} IS NULL
           OR {lease:k,l,lease_expires_at} <= now(),
       coalesce(extract(epoch FROM {lease:k,l,lease_expires_at} - now()), 0)::float8
FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS w(id, fence, scope)
LEFT JOIN {t} k ON k.scope = w.scope AND k.id = w.id
LEFT JOIN {l} l ON l.scope = w.scope AND l.key_id = k.id`)

	// notifyWaiters is idem_notify_waiters on its own (scope $1, id $2),
	// run after a finishing commit at repeatable read or serializable, whose
	// trigger's call saw only the marks of its snapshot
	// (phaseTx.commitGuarded). It names the function with the prefix
	// itself, not through render.
	q.notifyWaiters = "SELECT " + prefix + "idem_notify_waiters($1::text, $2::bigint)"

	q.getKey = render(`SELECT {cols:k,l} FROM {t} k ` + leaseOf(l, "$1") + ` WHERE k.scope = $1 AND k.key = $2::text`)

	// unlockKey moves the fence on, which is what actually stops a live
	// holder: its next guarded statement matches no row. The foreign mark
	// stays, so a not-idempotent call in doubt still goes to reconcile. The
	// second branch reports a finished (or concurrently vanished) key as it
	// is.
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
SELECT false, {cols:k,l} FROM {t} k ` + leaseOf(l, "$1") + `
WHERE k.scope = $1 AND k.key = $2::text AND NOT EXISTS (SELECT 1 FROM unlocked WHERE unlocked.id = k.id)`)

	// claimIdle hands each idle key to one caller: FOR UPDATE SKIP LOCKED
	// passes over rows another claimer is marking, and a row it marked and
	// committed no longer looks idle (the WHERE is re-checked on the latest
	// version). Candidates come from the unfinished window ($9, $10:
	// unfinishedAmong), never the finished millions.
	//
	// Keys an earlier process of this store's instance ($7, with another
	// boot than $8) held when it died are claimed at once, idle or not,
	// their lease still running: the acquisition that runs them takes them
	// over (see takeOverLease).
	q.claimIdle = render(`
WITH clock AS (
    SELECT coalesce($1::timestamptz, now()) AS t
), candidates AS (
    SELECT k.id
    FROM {t} k CROSS JOIN clock c LEFT JOIN {l} l ON l.scope = k.scope AND l.key_id = k.id
    ` + idleKeys + `
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
SELECT {meta:claimed,l} FROM claimed LEFT JOIN {l} l ON l.scope = claimed.scope AND l.key_id = claimed.id ORDER BY claimed.id`)

	// reap deletes one batch through idem_keys_reap: keys whose reap_after
	// (creation plus retention) has passed, of which those finished and
	// expired. The few it passes over (unfinished, finished late) come
	// before the batch again next time, a cost of one index entry each. The ids are collected
	// into an array first so the DELETE finds its rows by primary key
	// rather than by a join the planner might turn into a scan. Deleting a
	// key deletes its lease row, if any (ON DELETE CASCADE), and sets the key
	// column of business rows that reference it to NULL (their foreign keys
	// are ON DELETE SET NULL); those rows survive.
	q.reap = render(`
DELETE FROM {t}
WHERE id = ANY(ARRAY(
    SELECT id FROM {t}
    WHERE reap_after <= coalesce($1::timestamptz, now())
      AND status = 'finished' AND expires_at <= coalesce($1::timestamptz, now())
    ORDER BY reap_after
    LIMIT $2
    FOR UPDATE SKIP LOCKED
))`)

	// reapAbandoned ends one batch of keys abandoned unfinished: running
	// (never needs_reconcile), nobody holding them, created longer ago than
	// their flow's age ($3/$4 name flows with ages of their own, in
	// microseconds; $2 is everyone else's; a negative age never abandons).
	// Both rows are locked (SKIP LOCKED passes over a key a heartbeat or a
	// takeover is writing), and the lease is re-checked on the lease row's
	// latest version, so a key taken over meanwhile is left alone.
	// Candidates come from the unfinished window ($6, $7: unfinishedAmong).
	//
	// A key whose foreign mark stands (a not-idempotent call in doubt: its
	// process died after the call, before the phase committed) is not
	// deleted: a request with the key would then run anew and repeat the
	// call. It goes to needs_reconcile instead, for a reconcile run to ask
	// its provider. Every other candidate is deleted, its lease row with it
	// (ON DELETE CASCADE). The statement returns (deleted, parked).
	q.reapAbandoned = render(`
WITH candidates AS MATERIALIZED (
    SELECT k.id, (l.foreign_mark IS NOT NULL AND l.foreign_mark_after = k.recovery_point) AS marked
    FROM {t} k
    JOIN {l} l ON l.scope = k.scope AND l.key_id = k.id
    CROSS JOIN (SELECT coalesce($1::timestamptz, now()) AS t) c
    LEFT JOIN unnest($3::text[], $4::bigint[]) AS f(flow, age) ON f.flow = k.flow
    WHERE ` + unfinishedAmong("k", 6, 7) + ` AND k.status = 'running'
      AND (l.locked_at IS NULL OR l.lease_expires_at <= c.t)
      AND coalesce(f.age, $2::bigint) >= 0
      AND k.created_at <= c.t - coalesce(f.age, $2::bigint) * interval '1 microsecond'
    ORDER BY k.id
    LIMIT $5
    FOR UPDATE OF k, l SKIP LOCKED
), parked AS (
    UPDATE {t}
    SET status = 'needs_reconcile',
        last_error = 'unfinished past its UnfinishedRetention with a not-idempotent call in doubt; a reconcile run decides'
    WHERE id = ANY(ARRAY(SELECT id FROM candidates WHERE marked))
    RETURNING {notify}(scope, id)
), deleted AS (
    DELETE FROM {t}
    WHERE id = ANY(ARRAY(SELECT id FROM candidates WHERE NOT marked))
    RETURNING 1
)
SELECT (SELECT count(*) FROM deleted), (SELECT count(*) FROM parked)`)

	// leaseRow is the insert that makes a key's lease row from the first
	// lease its key row carries, for a statement that must lock the lease
	// row (reapAbandoned, reapAbandonedOne): their check that nobody holds
	// the key must run on the lease row's newest version, which a locking
	// read reaches and a snapshot of a key with no lease row does not (a
	// heartbeat may make the row after the snapshot). The copy changes no
	// lease: a key without a lease row is held by its key row's, and a key
	// whose lease row exists keeps it (DO NOTHING). The key row is read, not
	// written. Its first lease changes only to be unlocked (release,
	// setNeedsReconcile), so a copy from an older snapshot is at worst a
	// lease still held, which the caller then leaves alone; a key whose
	// fence moved has a lease row already.
	const leaseRow = `
INSERT INTO {l} (scope, key_id, fence, locked_at, lease_expires_at,
    holder_instance, holder_host, holder_pid, holder_boot, holder_fence)
SELECT k.scope, k.id, k.fence, k.locked_at, k.lease_expires_at,
    k.holder_instance, k.holder_host, k.holder_pid, k.holder_boot, k.fence
FROM {t} k%s
ON CONFLICT (scope, key_id) DO NOTHING`
	// leaseRowsAbandoned makes them for reapAbandoned's candidates, with its
	// parameters.
	q.leaseRowsAbandoned = render(fmt.Sprintf(leaseRow, `
CROSS JOIN (SELECT coalesce($1::timestamptz, now()) AS t) c
LEFT JOIN unnest($3::text[], $4::bigint[]) AS f(flow, age) ON f.flow = k.flow
WHERE `+unfinishedAmong("k", 6, 7)+` AND k.status = 'running'
  AND NOT EXISTS (SELECT 1 FROM {l} x WHERE x.scope = k.scope AND x.key_id = k.id)
  AND (k.locked_at IS NULL OR k.lease_expires_at <= c.t)
  AND coalesce(f.age, $2::bigint) >= 0
  AND k.created_at <= c.t - coalesce(f.age, $2::bigint) * interval '1 microsecond'
ORDER BY k.id
LIMIT $5`))
	// leaseRowOf makes the lease row of one key (scope $1, id $2, fence $3).
	q.leaseRowOf = render(fmt.Sprintf(leaseRow, `
WHERE k.scope = $1::text AND k.id = $2 AND k.fence = $3`))

	// On Citus, SELECT ... FOR UPDATE runs only in router queries: the
	// batches of claimIdle, reap and reapAbandoned are read without locks
	// from every shard, then claimed key by key, each claim a router
	// statement that re-checks under the row lock that the key is as it
	// was read (citus.go).
	//
	// claimIdleCandidates is claimIdle's read, over every shard and without
	// a lock; claimIdleOne claims one candidate (scope $1, id $2) if it is
	// still as read: the same fence ($3) and the same last run ($4), which
	// every phase commit, takeover and claim moves. The locking read
	// re-checks them on the row's newest version, so of two claimers one
	// gets the key, the other no row; SKIP LOCKED passes over a row another
	// transaction holds, as claimIdle does, so one busy key never holds up
	// the batch behind it.
	q.claimIdleCandidates = render(`
WITH clock AS (
    SELECT coalesce($1::timestamptz, now()) AS t
)
SELECT k.scope, k.id, k.fence, k.last_run_at, c.t
FROM {t} k CROSS JOIN clock c LEFT JOIN {l} l ON l.scope = k.scope AND l.key_id = k.id
` + idleKeys + `
ORDER BY k.last_run_at
LIMIT $6`)
	q.claimIdleOne = render(`
WITH candidate AS (
    SELECT k.id FROM {t} k
    WHERE k.scope = $1::text AND k.id = $2 AND k.fence = $3 AND k.last_run_at = $4::timestamptz
      AND k.status <> 'finished'
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE {t} k
    SET last_run_at = $5::timestamptz
    FROM candidate
    WHERE k.scope = $1::text AND k.id = candidate.id
    RETURNING k.*
)
SELECT {meta:claimed,l} FROM claimed LEFT JOIN {l} l ON l.scope = $1::text AND l.key_id = claimed.id`)

	// reapCandidates reads a batch of expired keys (scope, id) from every shard, with
	// the clock it used; reapDelete deletes them ($1 scopes, $2 ids, $3 that
	// clock), the conditions re-checked under the row locks: a key two
	// reapers both read is deleted once.
	q.reapCandidates = render(`
WITH clock AS (
    SELECT coalesce($1::timestamptz, now()) AS t
)
SELECT k.scope, k.id, c.t FROM {t} k, clock c
WHERE k.reap_after <= c.t AND k.status = 'finished' AND k.expires_at <= c.t
ORDER BY k.reap_after
LIMIT $2`)
	q.reapDelete = render(`
DELETE FROM {t}
WHERE scope = ANY($1::text[]) AND id = ANY($2::bigint[]) AND status = 'finished' AND expires_at <= $3::timestamptz`)

	// reapAbandonedCandidates reads candidates from every shard without a lock
	// (scope, id, fence, clock); reapAbandonedOne ends one (scope $1, id $2,
	// fence $3, clock $4) in a router statement that locks both rows and
	// re-checks that nobody holds it, as the plain statement does. SKIP
	// LOCKED, as there: its transaction made the lease row (leaseRowOf)
	// before locking the progress row, so a takeover, unlock or waiter's
	// mark that locked the progress row and waits for that lease row would
	// otherwise wait in a cycle with it.
	q.reapAbandonedCandidates = render(`
WITH clock AS (
    SELECT coalesce($1::timestamptz, now()) AS t
)
SELECT k.scope, k.id, k.fence, c.t
FROM {t} k
LEFT JOIN {l} l ON l.scope = k.scope AND l.key_id = k.id
CROSS JOIN clock c
LEFT JOIN unnest($3::text[], $4::bigint[]) AS f(flow, age) ON f.flow = k.flow
WHERE ` + unfinishedAmong("k", 6, 7) + ` AND k.status = 'running'
  AND ({lease:k,l,locked_at} IS NULL OR {lease:k,l,lease_expires_at} <= c.t)
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
    FOR UPDATE OF k, l SKIP LOCKED
), parked AS (
    UPDATE {t}
    SET status = 'needs_reconcile',
        last_error = 'unfinished past its UnfinishedRetention with a not-idempotent call in doubt; a reconcile run decides'
    WHERE scope = $1::text AND id IN (SELECT id FROM candidate WHERE marked)
    RETURNING 1
), deleted AS (
    DELETE FROM {t}
    WHERE scope = $1::text AND id IN (SELECT id FROM candidate WHERE NOT marked)
    RETURNING 1
)
SELECT (SELECT count(*) FROM deleted), (SELECT count(*) FROM parked)`)

	// unfinishedKeys counts the unfinished keys of flows $1 by flow,
	// recovery point, standing mark and status, among the unfinished
	// window ($2, $3). A mark stands while the key is still at the
	// recovery point it was made at.
	q.unfinishedKeys = render(`
SELECT k.flow::text AS flow, k.recovery_point::text AS recovery_point,
       CASE WHEN l.foreign_mark_after = k.recovery_point THEN coalesce(l.foreign_mark, '') ELSE '' END AS mark,
       k.status::text AS status, count(*)::int AS keys
FROM {t} k LEFT JOIN {l} l ON l.scope = k.scope AND l.key_id = k.id
WHERE ` + unfinishedAmong("k", 2, 3) + ` AND k.flow = ANY($1::text[])
GROUP BY 1, 2, 3, 4
ORDER BY 1, 2, 3, 4`)
	// statementTimeout bounds the statements after it (milliseconds, as
	// text): for the session when the connection's backend is the one it
	// announced ($2, its pid), else for the transaction alone; it returns
	// whether it set the session (phaseTx.timeoutSetting).
	q.statementTimeout = `SELECT pg_backend_pid() = $2::bigint, set_config('statement_timeout', $1, pg_backend_pid() <> $2::bigint)`
	q.resetStatementTimeout = `RESET statement_timeout`
	// localStatementTimeout bounds the statements after it in the same
	// transaction (milliseconds, as text): a maintainer's batch.
	q.localStatementTimeout = `SELECT set_config('statement_timeout', $1, true)`

	q.clock = `SELECT coalesce($1::timestamptz, now()) AS t`

	// The sweep (sweep.go). sweepState reads the cursor, whether a sweep
	// is due ($1: the lag in microseconds, on the database's own clock,
	// never a test's), whether its row exists, and the stragglers' ids, in
	// one round trip; sweepClaim locks the row of a due sweep whose stops
	// are safe (below), passing over one another process sweeps (SKIP
	// LOCKED), and returns (cursor, ready stop, next stop); sweepChunkEnd is
	// where a chunk of at most $3 keys in ($1, $2] ends; sweepList lists
	// the keys in ($1, $2] still unfinished; sweepForget forgets the
	// stragglers that finished (the reaper deletes the rows of those it
	// deletes); sweepPass moves the cursor after a chunk short of the ready
	// stop; sweepMove moves it to the ready stop $1, makes the next stop ($2)
	// the ready one, and records the next: the newest id now, with the xmax
	// of the snapshot that saw it.
	//
	// A claim succeeds when no session of the database other than this one
	// holds a snapshot (backend_xmin) or a transaction id (backend_xid) as
	// old as next_xid, both of which pg_stat_activity shows every role, nor
	// does a prepared transaction. Each is compared by its age against the
	// xid recorded (xid8 as a number), which errs towards waiting; a session
	// with neither (NULL ages) holds nothing. Then:
	//
	//   - every insert that took an id up to next_id has ended its
	//     statement: it took the id after its statement's snapshot, which it
	//     keeps until the statement ends, however long it waits for a lock,
	//     and that snapshot is older than the one that saw next_id. It may
	//     still be committing (a WAL flush, a synchronous standby), with a
	//     transaction id taken after next_xid but before this claim, and so
	//     before the next move's xmax: next_id becomes the ready stop;
	//   - every insert that took an id up to the ready stop, made ready by
	//     the claim before, has committed or failed, as no transaction id
	//     as old as the last move's xmax is left: the cursor moves there.
	//
	// The sweep runs at read committed, so that each statement after the
	// claim reads with a snapshot taken after the claim read the sessions.
	//
	// A missing row (the table emptied by hand) reads as cursor 0, a sweep
	// due: every key is in the window until the sweep makes the row again
	// (sweepEnsure, sent only then) and moves the cursor.
	q.sweepState = render(`
SELECT coalesce(max(swept_id), 0), coalesce(bool_and(next_at <= clock_timestamp() - $1::bigint * interval '1 microsecond'), true),
    count(*) > 0, (SELECT coalesce(array_agg(key_id), '{}') FROM {stragglers})
FROM {sweep}`)
	q.sweepEnsure = render(`
INSERT INTO {sweep} (swept_id, ready_id, next_id, next_xid, next_at) VALUES (0, 0, 0, 0, '-infinity')
ON CONFLICT (one) DO NOTHING`)
	q.sweepClaim = render(`
WITH x AS (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax)
SELECT w.swept_id, w.ready_id, w.next_id FROM {sweep} w, x
WHERE w.next_at <= clock_timestamp() - $1::bigint * interval '1 microsecond'
  AND NOT EXISTS (
    SELECT 1 FROM pg_stat_activity a
    WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
      AND x.xmax - greatest(age(a.backend_xmin), age(a.backend_xid)) <= w.next_xid)
  AND NOT EXISTS (
    SELECT 1 FROM pg_prepared_xacts p
    WHERE p.database = current_database() AND x.xmax - age(p.transaction) <= w.next_xid)
FOR UPDATE OF w SKIP LOCKED`)
	q.sweepChunkEnd = render(`
SELECT coalesce((SELECT id FROM {t} WHERE id > $1::bigint AND id <= $2::bigint ORDER BY id OFFSET $3::int - 1 LIMIT 1), $2::bigint)`)
	q.sweepList = render(`
INSERT INTO {stragglers} (scope, key_id)
SELECT k.scope, k.id FROM {t} k
WHERE k.id > $1::bigint AND k.id <= $2::bigint AND k.status <> 'finished'
ON CONFLICT (scope, key_id) DO NOTHING`)
	q.sweepForget = render(`
DELETE FROM {stragglers} s USING {t} k
WHERE k.scope = s.scope AND k.id = s.key_id AND k.status = 'finished'`)
	q.sweepPass = render(`UPDATE {sweep} SET swept_id = $1::bigint`)
	q.sweepMove = render(`
UPDATE {sweep} SET swept_id = $1::bigint, ready_id = greatest($1::bigint, $2::bigint),
    next_id = greatest($2::bigint, n.id), next_xid = n.xmax, next_at = clock_timestamp()
FROM (SELECT coalesce(max(id), 0) AS id, pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax FROM {t}) n`)

	// backlog counts unfinished keys by status, among the unfinished window
	// ($2, $3: unfinishedAmong), never the finished millions.
	q.backlog = render(`
WITH clock AS (
    SELECT coalesce($1::timestamptz, now()) AS t
), counted AS (
    SELECT status::text AS status, count(*) AS keys, min(created_at) AS oldest
    FROM {t} k WHERE ` + unfinishedAmong("k", 2, 3) + ` GROUP BY status
)
SELECT s.status, coalesce(c.keys, 0), c.oldest, clock.t
FROM (VALUES (1, 'running'), (2, 'needs_reconcile')) s(n, status)
CROSS JOIN clock LEFT JOIN counted c ON c.status = s.status
ORDER BY s.n`)
	return q
}

// wakeWaiters ends a statement that ends an attempt (finishPhase,
// setNeedsReconcile) with a WHERE that calls idem_notify_waiters (scope,
// the CTE's id) for the row its CTE matched: the function reads the key's
// mark and notifies only a marked key. It is VOLATILE, so at read committed
// it reads with a snapshot of its own, taken after the statement's update
// got the row: it sees a mark committed while the update waited for the
// row lock (a mark locks the progress row FOR SHARE). Called from the
// statement, not from an AFTER trigger on every finish: no trigger queue,
// one PL/pgSQL call less. It returns a boolean, never NULL, so the WHERE
// keeps every row the count counts.
func wakeWaiters(scope, cte string) string {
	return ` WHERE {notify}(` + scope + `::text, ` + cte + `.id) IS NOT NULL`
}

// forCitus switches the statements to the Citus layout: the tables are
// distributed, and the finish and the parking of a key do not notify (a
// notification on the worker that holds the row would reach no listener;
// waits poll on Citus).
func (q *queries) forCitus() {
	q.citus = true
	q.finishPhase, q.setNeedsReconcile = q.finishPhaseQuiet, q.setNeedsReconcileQuiet
}

// commitStatement is the guarded statement that records p on its key:
// advancePhase for a phase that advances, finishPhase for one that responds.
// bodyKeyID names the key that sealed p.Response.Body ("": in the clear).
func (q *queries) commitStatement(p idemdriver.CommitParams, bodyKeyID string) (string, []any, error) {
	// The patch's values are JSON already (SetCheckpoint encoded each):
	// they are written into the object as they are (appendPatch).
	patch := json.RawMessage(appendPatch(nil, p.CheckpointPatch))
	switch {
	case p.Status == idemtype.StoredFinished && p.Response != nil:
		body, header := p.Response.Body, p.Response.Header
		if body == nil {
			body = []byte{}
		}
		if header == nil {
			header = map[string][]string{}
		}
		// The header travels as JSON text, like the checkpoint: a map has
		// no type pgx can encode without asking the server (exec and
		// simple_protocol modes do not ask).
		headerJSON := appendHeader(nil, header)
		return q.finishPhase, []any{p.Ref.ID, p.Ref.Fence, patch, p.Response.Status, string(headerJSON), body, p.Retention.Microseconds(), p.Now, bodyKeyID,
			cmp.Or(p.RecoveryPoint, idemtype.RecoveryPointFinished), p.LastError, p.Ref.Scope}, nil
	case p.Status == idemtype.StoredRunning:
		sql := q.advancePhase
		if p.ClearForeignMark {
			sql = q.withdrawPhase
		}
		return sql, []any{p.Ref.ID, p.Ref.Fence, p.RecoveryPoint, patch, p.Now, p.Ref.Scope}, nil
	}
	return "", nil, fmt.Errorf("pgstore: commit phase: status %q (with a response: %t) is neither an advance nor a finish", p.Status, p.Response != nil)
}

// keyStateConditions are the WHERE conditions of each idemtype.KeyState, over
// the progress row k, its lease row l and the clock c. The listing adds the
// unfinished window (unfinishedAmong) to the unfinished states'.
var keyStateConditions = map[idemtype.KeyState]string{
	idemtype.KeyStateRunning:        `k.status <> 'finished' AND k.status = 'running' AND ` + leaseCol("k", "l", "locked_at") + ` IS NOT NULL AND ` + leaseCol("k", "l", "lease_expires_at") + ` > c.t`,
	idemtype.KeyStateStale:          `k.status <> 'finished' AND k.status = 'running' AND (` + leaseCol("k", "l", "locked_at") + ` IS NULL OR ` + leaseCol("k", "l", "lease_expires_at") + ` <= c.t)`,
	idemtype.KeyStateNeedsReconcile: `k.status <> 'finished' AND k.status = 'needs_reconcile'`,
	idemtype.KeyStateFinished:       `k.status = 'finished' AND k.expires_at > c.t`,
	idemtype.KeyStateExpired:        `k.status = 'finished' AND k.expires_at <= c.t`,
}

// listKeys renders the key listing for p: only the filters p sets appear,
// so each combination gets a plan of its own.
func (q *queries) listKeys(p idemdriver.ListKeysParams, w *unfinishedWindow) (string, []any, error) {
	args := []any{p.Now}
	var where []string
	add := func(cond string, arg any) {
		args = append(args, arg)
		where = append(where, strings.ReplaceAll(cond, "$?", fmt.Sprintf("$%d", len(args))))
	}
	if p.State != "" {
		cond, ok := keyStateConditions[p.State]
		if !ok {
			return "", nil, fmt.Errorf("%w: unknown key state %q", idemtype.ErrInvalidRequest, p.State)
		}
		where = append(where, cond)
	}
	if w != nil {
		args = append(args, w.args()...)
		where = append(where, unfinishedAmong("k", len(args)-1, len(args)))
	}
	if p.Scope != "" {
		add("k.scope = $?", p.Scope)
	}
	if p.Key != "" {
		add("k.key = $?::text", p.Key)
	}
	if p.Flow != "" {
		add("k.flow = $?::text", p.Flow)
	}
	if p.ID > 0 {
		add("k.id = $?", p.ID)
	}
	if p.BeforeID > 0 {
		add("k.id < $?", p.BeforeID)
	}
	if len(where) == 0 {
		where = append(where, "true")
	}
	args = append(args, p.Limit)
	join := leaseOf(q.leases, "k.scope")
	cols := metaColumns
	if p.Reveal {
		cols = allColumns
	}
	sql := fmt.Sprintf(`
WITH clock AS (
    SELECT coalesce($1::timestamptz, now()) AS t
)
SELECT c.t AS db_now, %s
FROM %s k CROSS JOIN clock c %s
WHERE %s
ORDER BY k.id DESC
LIMIT $%d`, recordColumnsOf("k", "l", cols), q.table, join, strings.Join(where, "\n  AND "), len(args))
	return sql, args, nil
}

// first is fps[0], or nil: the fingerprint a new key stores (see
// idemdriver.AcquireParams.Fingerprints).
func first(fps [][]byte) []byte {
	if len(fps) == 0 {
		return nil
	}
	return fps[0]
}

// idleKeys is the WHERE clause of the keys the completer and reconcile runs
// may claim (k the key, l its lease, c.t the clock): in status $2, of the
// flows $3, nobody holding them and idle for $4 microseconds, or held by a
// dead process of this store's instance ($7, another boot than $8); under
// $5 attempts. claimIdle and Citus's claimIdleCandidates share it.
var idleKeys = `WHERE ` + unfinishedAmong("k", 9, 10) + ` AND k.status = $2::text AND k.flow = ANY($3::text[])
  AND ((({lease:k,l,locked_at} IS NULL OR {lease:k,l,lease_expires_at} <= c.t)
        AND k.last_run_at <= c.t - $4::bigint * interval '1 microsecond')
       OR ({lease:k,l,locked_at} IS NOT NULL AND (l.key_id IS NULL OR l.holder_fence = l.fence)
           AND {lease:k,l,holder_instance} = nullif($7::text, '') AND {lease:k,l,holder_boot} <> $8::text))
  AND ($5::int <= 0 OR k.attempts < $5::int)`
