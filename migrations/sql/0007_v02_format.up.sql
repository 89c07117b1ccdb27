-- Version 7 is idem's v0.2 format, from v0.1.0's version 6:
--
--  - one fingerprint per key: the keyed fingerprint of what the client sent
--    (33 bytes, the scheme byte 2 and the hash). Keys v0.1.0 finished keep
--    theirs (32 bytes, over the decoded input), which v0.2 does not compute:
--    a retry of such a key is replayed without comparing, for as long as it
--    is retained (idemdriver.KeyRecord.FromV01; deleted in v0.3);
--  - one derivation of downstream idempotency keys, from the request itself
--    and the key's generation (downstream_scheme goes): a request that
--    reuses a key after it expired is one generation on;
--  - the scope in every primary and foreign key, (scope, id) and (scope,
--    key_id), on plain PostgreSQL as on Citus, so that every statement names
--    the scope and runs unchanged on both. idem_keys keeps a unique id on
--    plain PostgreSQL, for business tables that reference a key by id (ON
--    DELETE SET NULL); their foreign keys are moved onto it here;
--  - one acquisition function, idem_acquire, which also names the lease's
--    holder; the lease's holder and waiters (waited_at, notified when an
--    attempt ends) on the lease row;
--  - one row per key for a request that needs no more: idem_keys carries the
--    key's first lease, and its lease row is made only when something must
--    write the lease. The table is rebuilt with its columns in the order of
--    what writes them, and without request_id (random, per row, which no
--    v0.2 derivation reads).
--
-- A key in flight cannot cross: its fingerprint and its downstream keys
-- change. The migration refuses (SQLSTATE IDEM1, migrations.ErrRefused)
-- while any key is unfinished: drain first (docs/operations.md, "Upgrading
-- to v0.2"). It locks both tables for its whole transaction, so no key
-- starts between the check and the change.
--
-- A v0.1.0 process still running afterwards calls idem_acquire with
-- v0.1.0's arguments, which now refuses with SQLSTATE 57P03 (cannot connect
-- now): v0.1.0 reports the store unavailable (503) and runs nothing.
DO $$
BEGIN
    -- The check for keys in flight below must see what was committed while
    -- LOCK TABLE waited: a snapshot taken before it would not.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'idem: migration 0007 must run at read committed (it runs at %): its check for keys in flight would miss keys committed while it waited for its lock', current_setting('transaction_isolation')
            USING ERRCODE = 'IDEM1';
    END IF;
END
$$;

LOCK TABLE {{schema}}idem_keys, {{schema}}idem_leases IN ACCESS EXCLUSIVE MODE;

DO $$
DECLARE
    n bigint;
BEGIN
    -- Columns only main's unreleased development builds (versions 7-11)
    -- added: such a database is not at v0.1.0's version 6.
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
               WHERE attrelid = '{{schema}}idem_keys'::regclass AND NOT attisdropped
                 AND attname IN ('generation', 'payload_fingerprint')) THEN
        RAISE EXCEPTION 'idem: this schema was migrated by an unreleased development build of idem (schema versions 7-11), not by v0.1.0; v0.2 migrates from v0.1.0 only: drain its keys and revert it to version 6 with that build (idem migrate down --to 6), or drop idem''s tables if none must be kept, then migrate up'
            USING ERRCODE = 'IDEM1';
    END IF;
    SELECT count(*) INTO n FROM {{schema}}idem_keys WHERE status <> 'finished';
    IF n > 0 THEN
        RAISE EXCEPTION 'idem: % keys are unfinished; v0.2 (migration 0007) cannot take keys in flight from v0.1.0: stop sending v0.1.0 new requests, let its keys finish (idem keys list --state running, stale or needs_reconcile; idem complete, idem reconcile), then migrate up again (docs/operations.md, "Upgrading to v0.2")', n
            USING ERRCODE = 'IDEM1';
    END IF;
END
$$;

-- Every lease row left is a finished key's, which means nothing. The table
-- is made anew with the scope.
DROP TABLE {{schema}}idem_leases;

-- idem_keys is made anew, its rows (all finished) copied: v0.2's row carries
-- its first lease, and its columns are ordered for what writes them. An
-- update's WAL record logs only the bytes between the longest unchanged
-- prefix and suffix of the row, and a phase commit rewrites the last
-- columns: fixed-width columns written once come first, then the immutable
-- variable-width ones, then what the finish writes once, and last what every
-- phase commit rewrites (a fixed-width column placed after a growing
-- checkpoint would move with it and be logged again on every commit).
--
-- Business tables' foreign keys to idem_keys (id) are dropped and made again,
-- the same, on the new table's unique id (idem_keys_id); the sequence goes on
-- from the old table's, so no id is ever reused.
DO $$
DECLARE
    fk record;
    v_next bigint;
BEGIN
    CREATE TEMPORARY TABLE idem_business_fks (stmt text) ON COMMIT DROP;
    FOR fk IN SELECT conrelid::regclass AS tbl, conname, pg_get_constraintdef(oid) AS def
              FROM pg_catalog.pg_constraint
              WHERE contype = 'f' AND confrelid = '{{schema}}idem_keys'::regclass
                AND conparentid = 0 LOOP
        INSERT INTO idem_business_fks VALUES (format('ALTER TABLE %s ADD CONSTRAINT %I %s', fk.tbl, fk.conname, fk.def));
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', fk.tbl, fk.conname);
    END LOOP;
    EXECUTE format('SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM %s',
                   pg_get_serial_sequence('{{schema}}idem_keys', 'id')) INTO v_next;
    CREATE TEMPORARY TABLE idem_next_id (v bigint) ON COMMIT DROP;
    INSERT INTO idem_next_id VALUES (v_next);
END
$$;

ALTER TABLE {{schema}}idem_keys RENAME TO idem_keys_v01;
ALTER TABLE {{schema}}idem_keys_v01
    RENAME CONSTRAINT idem_keys_pkey TO idem_keys_v01_pkey;
ALTER TABLE {{schema}}idem_keys_v01
    RENAME CONSTRAINT idem_keys_scope_key TO idem_keys_v01_scope_key;
ALTER TABLE {{schema}}idem_keys_v01
    RENAME CONSTRAINT idem_keys_finished_has_response TO idem_keys_v01_finished_has_response;
ALTER TABLE {{schema}}idem_keys_v01
    RENAME CONSTRAINT idem_keys_scope_check TO idem_keys_v01_scope_check;
ALTER INDEX {{schema}}idem_keys_reap RENAME TO idem_keys_v01_reap;
DO $$
BEGIN
    EXECUTE format('ALTER SEQUENCE %s RENAME TO idem_keys_v01_id_seq',
                   pg_get_serial_sequence('{{schema}}idem_keys_v01', 'id'));
END
$$;
ALTER INDEX {{schema}}idem_keys_unfinished RENAME TO idem_keys_v01_unfinished;

CREATE TABLE {{schema}}idem_keys (
    -- Fixed-width, written by the insert; fence and attempts also by the
    -- rare statements that take a key over or unlock it.
    id               bigint      GENERATED ALWAYS AS IDENTITY,
    created_at       timestamptz NOT NULL DEFAULT now(),
    -- The earliest the key can expire: its creation plus its flow's
    -- retention, which a finish then counts from its own time into
    -- expires_at. The reaper finds keys by it (idem_keys_reap), never by
    -- expires_at, which the finish writes. The default is a bound too,
    -- the loosest: every reaper pass looks at such a row until it expires.
    reap_after       timestamptz NOT NULL DEFAULT '-infinity',
    fence            bigint      NOT NULL DEFAULT 1,
    attempts         int         NOT NULL DEFAULT 1,
    -- generation counts the requests a (scope, key) carried while its rows
    -- were replaced: 0 for a key never seen, one more than the expired key's
    -- for a key that replaces one. Downstream keys hash it in when it is not
    -- 0, so a provider that still remembers the expired request's keys does
    -- not answer the new one with its result.
    generation       int         NOT NULL DEFAULT 0,
    -- The key's first lease, taken by the insert that made the row. It holds
    -- until a lease row (idem_leases) exists for the key, which then holds
    -- the lease for good: the row is made only when something must write
    -- the lease (a heartbeat, a foreign mark, a waiter's mark, a takeover,
    -- an unlock), so that a request that needs none writes one row. A
    -- release unlocks both.
    holder_pid       int,
    locked_at        timestamptz,
    lease_expires_at timestamptz,

    -- Variable-width, written by the insert.
    scope            text        NOT NULL CHECK (char_length(scope) BETWEEN 1 AND 255),
    key              {{schema}}idem_key NOT NULL,
    flow             {{schema}}idem_flow NOT NULL,
    method           {{schema}}idem_method NOT NULL,
    path             {{schema}}idem_path NOT NULL,
    fingerprint      bytea       NOT NULL,
    params_key_id    text,
    holder_instance  text,
    holder_host      text,
    holder_boot      text,
    params           jsonb       NOT NULL,

    -- Written once, by the phase that responds (NULL until then).
    finished_at      timestamptz,
    expires_at       timestamptz,
    response_status  int,
    response_key_id  text,
    response_headers jsonb,
    response_body    bytea,
    last_error       text,
    -- Written by every phase commit, but changed only by the finish (or a
    -- reconcile run's first commit): unchanged, it is in the prefix an
    -- advance's WAL record leaves out.
    status           {{schema}}idem_status NOT NULL DEFAULT 'running',

    -- Rewritten by every phase commit.
    last_run_at      timestamptz NOT NULL DEFAULT now(),
    recovery_point   {{schema}}idem_recovery_point NOT NULL DEFAULT 'started',
    checkpoint       jsonb       NOT NULL DEFAULT '{}',

    CONSTRAINT idem_keys_finished_has_response
        CHECK (status <> 'finished' OR (response_status IS NOT NULL AND expires_at IS NOT NULL))
)
-- Every phase commit updates its key's row. Free room on the page lets
-- those updates be HOT (no index touched), provided they change no indexed
-- column: no index below covers a column a phase's advance writes.
WITH (fillfactor = 80);

INSERT INTO {{schema}}idem_keys (id, created_at, reap_after, fence, attempts, scope, key, flow, method, path,
    fingerprint, params_key_id, params, finished_at, expires_at, response_status, response_key_id,
    response_headers, response_body, last_error, last_run_at, status, recovery_point, checkpoint)
OVERRIDING SYSTEM VALUE
SELECT id, created_at, coalesce(expires_at, created_at), fence, attempts, scope, key, flow, method, path,
    fingerprint, params_key_id, params, finished_at, expires_at, response_status, response_key_id,
    response_headers, response_body, last_error, last_run_at, status, recovery_point, checkpoint
FROM {{schema}}idem_keys_v01;

DROP TABLE {{schema}}idem_keys_v01;

SELECT setval(pg_get_serial_sequence('{{schema}}idem_keys', 'id'), v, false) FROM idem_next_id;

-- The primary key leads with the scope, the distribution column on Citus;
-- idem_keys_id is what business tables reference (plain PostgreSQL only).
ALTER TABLE {{schema}}idem_keys
    ADD CONSTRAINT idem_keys_pkey PRIMARY KEY (scope, id),
    ADD CONSTRAINT idem_keys_scope_key UNIQUE (scope, key),
    ADD CONSTRAINT idem_keys_id UNIQUE (id);

-- No index names a column that a phase commit or the finish writes
-- (status, expires_at, recovery_point, ...): those updates stay HOT, one
-- new tuple on the same page and no index entry. The reaper, the completer
-- and the backlog find their keys through indexes nothing updates:
--
-- The reaper walks reap_after, set by the insert: every key it passes is
-- finished and expired, or one of the few that ran past their retention or
-- are still unfinished, re-checked and left.
CREATE INDEX idem_keys_reap ON {{schema}}idem_keys (reap_after);

-- The unfinished keys are those with an id past the sweep's cursor
-- (idem_sweep.swept_id: the keys created since about the last operation
-- that looked for them, found by idem_keys_id) and those the sweep listed
-- in idem_stragglers: keys it found still unfinished as its cursor passed
-- them. Neither needs an index on status. (On Citus, where each worker
-- numbers ids from a range of its own, the layout keeps a partial index of
-- unfinished keys instead: migrations/citus.)
CREATE TABLE {{schema}}idem_stragglers (
    scope  text   NOT NULL,
    key_id bigint NOT NULL,
    CONSTRAINT idem_stragglers_pkey PRIMARY KEY (scope, key_id),
    CONSTRAINT idem_stragglers_key_fkey FOREIGN KEY (scope, key_id)
        REFERENCES {{schema}}idem_keys (scope, id) ON DELETE CASCADE
);

-- One row: the sweep's cursor and its next two stops. Every key with an id
-- up to swept_id that was unfinished when the sweep passed it is in
-- idem_stragglers. next_id is the highest id the sweep saw when it last
-- moved, from a snapshot whose xmax was next_xid; ready_id is the next_id
-- of the move before, which the move after this one reaches (pgstore).
CREATE TABLE {{schema}}idem_sweep (
    one      boolean     PRIMARY KEY DEFAULT true CHECK (one),
    swept_id bigint      NOT NULL,
    ready_id bigint      NOT NULL,
    next_id  bigint      NOT NULL,
    next_xid bigint      NOT NULL,
    next_at  timestamptz NOT NULL
);
-- The table was rebuilt above under an exclusive lock: no insert is in
-- flight, every key is listed or finished.
INSERT INTO {{schema}}idem_stragglers (scope, key_id)
SELECT scope, id FROM {{schema}}idem_keys WHERE status <> 'finished';
INSERT INTO {{schema}}idem_sweep (swept_id, ready_id, next_id, next_xid, next_at)
SELECT coalesce(max(id), 0), coalesce(max(id), 0), coalesce(max(id), 0), 0, now() FROM {{schema}}idem_keys;

DO $$
DECLARE
    stmt text;
BEGIN
    FOR stmt IN SELECT f.stmt FROM idem_business_fks f LOOP
        EXECUTE stmt;
    END LOOP;
END
$$;

-- idem_leases holds what a key's holder writes while its phases run (see
-- migration 0003): the lease, which heartbeats renew from another
-- connection, and the foreign mark, so that neither ever makes the progress
-- row newer than a phase's snapshot. holder_* name the process that took the
-- lease at holder_fence (pgstore.Config.Instance): a process restarted
-- under the same instance name takes over its predecessor's keys at once.
-- waited_at is when a process first waited for the key (NULL: never): only
-- then does the end of its attempt notify.
--
-- A key's lease row is made when something first writes its lease: a
-- heartbeat, a foreign mark, a waiter's mark, a takeover, an unlock
-- (pgstore's statements, each an upsert guarded by the key's fence that
-- reads the progress row without writing it). Until then the key row's
-- first lease (locked_at, lease_expires_at, holder_*) is the lease; from then
-- on, the lease row is, and every reader of the lease reads it first. A
-- statement that decides nobody holds a key decides it on the lease row's
-- newest version (an upsert's conflict, or a locking read), never on a
-- snapshot that may predate the lease row.
CREATE TABLE {{schema}}idem_leases (
    scope              text        NOT NULL,
    key_id             bigint      NOT NULL,
    fence              bigint      NOT NULL,
    locked_at          timestamptz,
    lease_expires_at   timestamptz,
    foreign_mark       text,
    foreign_mark_after text,
    holder_instance    text,
    holder_host        text,
    holder_pid         int,
    holder_boot        text,
    holder_fence       bigint,
    waited_at          timestamptz,
    CONSTRAINT idem_leases_pkey PRIMARY KEY (scope, key_id),
    CONSTRAINT idem_leases_key_fkey FOREIGN KEY (scope, key_id)
        REFERENCES {{schema}}idem_keys (scope, id) ON DELETE CASCADE
);

-- v0.1.0's signature of idem_acquire refuses: a v0.1.0 process reports the
-- store unavailable (its 503) instead of acquiring keys it would
-- fingerprint, and derive downstream keys for, the old way. Delete in v0.3.
CREATE OR REPLACE FUNCTION {{schema}}idem_acquire(
    p_now timestamptz, p_scope text, p_key text, p_flow text, p_method text, p_path text,
    p_fingerprint bytea, p_params text, p_lease bigint, p_no_create boolean, p_params_key_id text)
RETURNS TABLE (
    acquired text, db_now timestamptz,
    id bigint, request_id text, downstream_scheme smallint, scope text, key text, flow text, method text, path text,
    fingerprint bytea, params jsonb, status text, recovery_point text, checkpoint jsonb,
    foreign_mark text, locked_at timestamptz, lease_expires_at timestamptz, fence bigint,
    response_status int, response_headers jsonb, response_body bytea, attempts int, last_error text,
    created_at timestamptz, last_run_at timestamptz, finished_at timestamptz, expires_at timestamptz,
    params_key_id text, response_key_id text)
LANGUAGE plpgsql
AS $idem_acquire$
BEGIN
    RAISE EXCEPTION 'idem: this database is migrated to idem v0.2 (schema version 7), and this process runs v0.1.0: deploy v0.2'
        USING ERRCODE = 'cannot_connect_now';
END
$idem_acquire$;

-- idem_acquire is the acquisition of a key: pgstore calls it as one
-- statement (SELECT * FROM idem_acquire(...)), one round trip, for a new key,
-- a replay and an in-progress key alike. It
--
--  - reads the key's progress row, and its lease row unless it is finished
--    (a finished key's lease row means nothing);
--  - reports it if it is live. A finished key past its expiry is absent,
--    whether or not the reaper has run, and is never replayed;
--  - otherwise, unless p_no_create, deletes the expired key (its lease row
--    goes with it, ON DELETE CASCADE) and inserts the key, locked by its
--    first lease on the row itself (no lease row: see idem_keys), one
--    generation on from the expired key it replaces (0 for a key never
--    seen). ON CONFLICT DO NOTHING turns a concurrent insert of the
--    same key into "nothing inserted" instead of a unique violation that
--    would abort the caller; the loop then reads the winner's key.
--
-- It returns at most one row: acquired ('created' or 'none'), db_now (the
-- clock it used), then pgstore's recordColumns, in their order, with their
-- names and types (a pgstore test compares them). A finished key comes back
-- without its params and checkpoint (NULL): a replay needs neither. No row
-- means nothing live and p_no_create; or, rarely, that a concurrent acquirer
-- or the reaper got in the way in a way only a new snapshot sees, and the
-- caller calls again.
--
-- Parameters: p_now overrides the database clock (NULL: now()); p_params is
-- the JSON to store, as text, parsed only when a key is inserted; p_lease is
-- the lease in microseconds, p_retention the flow's retention (reap_after);
-- p_params_key_id names the key that sealed
-- p_params ('' for the clear); p_holder_* name the process (see
-- idem_leases). Every statement names the scope, so that on Citus, where the
-- function is distributed by p_scope, it runs whole on the scope's worker.
--
-- Nothing is written unless the key is absent or expired, so a replay or an
-- in-progress answer takes no transaction id, writes no WAL and locks no
-- row. Each statement gets its own snapshot under read committed and shares
-- the transaction's under repeatable read or serializable, where a
-- concurrent insert the snapshot cannot see is a serialization failure that
-- the caller retries.
CREATE FUNCTION {{schema}}idem_acquire(
    p_now timestamptz, p_scope text, p_key text, p_flow text, p_method text, p_path text,
    p_fingerprint bytea, p_params text, p_lease bigint, p_no_create boolean, p_params_key_id text,
    p_holder_instance text, p_holder_host text, p_holder_pid int, p_holder_boot text, p_retention bigint)
RETURNS TABLE (
    acquired text, db_now timestamptz,
    id bigint, scope text, key text, flow text, method text, path text,
    fingerprint bytea, params jsonb, status text, recovery_point text, checkpoint jsonb,
    foreign_mark text, locked_at timestamptz, lease_expires_at timestamptz, fence bigint,
    response_status int, response_headers jsonb, response_body bytea, attempts int, last_error text,
    created_at timestamptz, last_run_at timestamptz, finished_at timestamptz, expires_at timestamptz,
    params_key_id text, response_key_id text, generation int,
    holder_instance text, holder_host text, holder_pid int, holder_boot text)
LANGUAGE plpgsql
AS $idem_acquire$
#variable_conflict error
DECLARE
    v_now        timestamptz := coalesce(p_now, now());
    v_acquired   text := 'none';
    v_found      boolean;
    v_generation int := 0;
    -- The key's progress row and lease row (all NULL until read).
    k {{schema}}idem_keys;
    l {{schema}}idem_leases;
BEGIN
    -- At most two reads: the second follows an insert that lost to a
    -- concurrent one, and finds the winner's key.
    FOR attempt IN 1..2 LOOP
        SELECT * INTO k FROM {{schema}}idem_keys t WHERE t.scope = p_scope AND t.key = p_key;
        v_found := FOUND;
        EXIT WHEN v_found AND NOT (k.status = 'finished' AND k.expires_at <= v_now);
        IF p_no_create OR attempt = 2 THEN
            -- NoCreate leaves an expired key as it is. A second read that
            -- finds nothing live (the winner's key already reaped, say):
            -- the caller's next call sees what happened.
            RETURN;
        END IF;

        IF v_found THEN
            -- Expired: delete it, re-checked on the row's newest version (a
            -- concurrent acquirer or the reaper may have deleted it first).
            DELETE FROM {{schema}}idem_keys d
            WHERE d.scope = p_scope AND d.id = k.id AND d.status = 'finished' AND d.expires_at <= v_now;
            v_generation := k.generation + 1;
        END IF;

        INSERT INTO {{schema}}idem_keys AS t
            (scope, key, flow, method, path, fingerprint, params, created_at, reap_after, last_run_at, params_key_id,
             generation, locked_at, lease_expires_at, holder_instance, holder_host, holder_pid, holder_boot)
        VALUES (p_scope, p_key, p_flow, p_method, p_path, p_fingerprint, p_params::jsonb, v_now,
                v_now + p_retention * interval '1 microsecond', v_now, nullif(p_params_key_id, ''), v_generation,
                v_now, v_now + p_lease * interval '1 microsecond',
                nullif(p_holder_instance, ''), nullif(p_holder_host, ''), nullif(p_holder_pid, 0),
                nullif(p_holder_boot, ''))
        ON CONFLICT ON CONSTRAINT idem_keys_scope_key DO NOTHING
        RETURNING * INTO k;
        IF FOUND THEN
            v_acquired := 'created';
            EXIT;
        END IF;
    END LOOP;

    -- An unfinished key's lease row, read from a snapshot a little newer
    -- than the progress row's under read committed, which is harmless: the
    -- runner only reports such a key, or takes it over with a statement that
    -- checks everything again under the row locks.
    IF v_acquired = 'none' AND k.status <> 'finished' THEN
        SELECT * INTO l FROM {{schema}}idem_leases t WHERE t.scope = p_scope AND t.key_id = k.id;
    END IF;

    -- pgstore's recordColumns over k and l, except for a finished key's
    -- params and checkpoint. Columns of domain types (migration 0006) are
    -- cast to text: RETURN QUERY needs the declared types exactly. The lease
    -- is the lease row's, or the key row's first lease while it has none.
    RETURN QUERY SELECT v_acquired, v_now,
        k.id, k.scope, k.key::text, k.flow::text, k.method::text, k.path::text,
        k.fingerprint, CASE WHEN k.status <> 'finished' THEN k.params END,
        k.status::text, k.recovery_point::text, CASE WHEN k.status <> 'finished' THEN k.checkpoint END,
        CASE WHEN k.status <> 'finished' AND l.foreign_mark_after = k.recovery_point
             THEN coalesce(l.foreign_mark, '') ELSE '' END,
        CASE WHEN k.status = 'finished' THEN NULL WHEN l.key_id IS NULL THEN k.locked_at ELSE l.locked_at END,
        CASE WHEN k.status = 'finished' THEN NULL WHEN l.key_id IS NULL THEN k.lease_expires_at ELSE l.lease_expires_at END,
        k.fence,
        coalesce(k.response_status, 0), coalesce(k.response_headers, '{}'),
        k.response_body, k.attempts, coalesce(k.last_error, ''),
        k.created_at, k.last_run_at, k.finished_at, k.expires_at,
        coalesce(k.params_key_id, ''), coalesce(k.response_key_id, ''), k.generation,
        CASE WHEN k.status = 'finished' THEN '' WHEN l.key_id IS NULL THEN coalesce(k.holder_instance, '')
             WHEN l.holder_fence = l.fence THEN coalesce(l.holder_instance, '') ELSE '' END,
        CASE WHEN k.status = 'finished' THEN '' WHEN l.key_id IS NULL THEN coalesce(k.holder_host, '')
             WHEN l.holder_fence = l.fence THEN coalesce(l.holder_host, '') ELSE '' END,
        CASE WHEN k.status = 'finished' THEN 0 WHEN l.key_id IS NULL THEN coalesce(k.holder_pid, 0)
             WHEN l.holder_fence = l.fence THEN coalesce(l.holder_pid, 0) ELSE 0 END,
        CASE WHEN k.status = 'finished' THEN '' WHEN l.key_id IS NULL THEN coalesce(k.holder_boot, '')
             WHEN l.holder_fence = l.fence THEN coalesce(l.holder_boot, '') ELSE '' END;
END
$idem_acquire$;

-- idem_notify_waiters sends the key's id (never the key: keys are tenants'
-- data) on the schema's channel, "idem_finished:" and the schema's name (or
-- its md5, when that would be longer than a channel name may be), when a
-- process waits for the key (waited_at), and returns whether it did. The
-- notification goes out when the caller's transaction commits. VOLATILE, so
-- under read committed its query sees a mark committed while the calling
-- statement waited for the key's row lock (a waiter's mark locks the
-- progress row FOR SHARE, which the finishing update waits for).
CREATE FUNCTION {{schema}}idem_notify_waiters(p_scope text, p_key bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $idem_notify_waiters$
DECLARE
    v_schema  text;
    v_channel text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {{schema}}idem_leases t
                   WHERE t.scope = p_scope AND t.key_id = p_key AND t.waited_at IS NOT NULL) THEN
        RETURN false;
    END IF;
    SELECT n.nspname INTO v_schema
    FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = '{{schema}}idem_leases'::regclass;
    v_channel := 'idem_finished:' || v_schema;
    IF octet_length(v_channel) > 63 THEN
        v_channel := 'idem_finished:' || md5(v_schema);
    END IF;
    PERFORM pg_notify(v_channel, p_key::text);
    RETURN true;
END
$idem_notify_waiters$;

-- The attempt that holds a key ends when the key leaves status running (a
-- phase finishes it, or parks it for reconciliation) or when its lease is
-- unlocked (a failed phase releases it, an operator unlocks it). The
-- statements that finish or park a key call idem_notify_waiters themselves
-- (pgstore's wakeWaiters): an AFTER trigger on idem_keys would run on every
-- finish, marked or not. A lease is unlocked by several statements, rarely:
-- a trigger wakes the waiters of a marked key, its condition checked row
-- by row at no cost. (Citus drops it: it would notify on a worker.)
CREATE FUNCTION {{schema}}idem_leases_unlocked()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
AS $idem_leases_unlocked$
BEGIN
    PERFORM {{schema}}idem_notify_waiters(NEW.scope, NEW.key_id);
    RETURN NULL;
END
$idem_leases_unlocked$;

CREATE TRIGGER idem_leases_unlocked AFTER UPDATE OF locked_at ON {{schema}}idem_leases
    FOR EACH ROW WHEN (OLD.locked_at IS NOT NULL AND NEW.locked_at IS NULL AND NEW.waited_at IS NOT NULL)
    EXECUTE FUNCTION {{schema}}idem_leases_unlocked();

-- idem_verdicts records every operator verdict on a key (idem.Runner.Resolve,
-- `idem keys resolve`): who gave it (the --operator named, and the database
-- role and client address of the session that wrote it), why, on which key,
-- generation and fence, on which phase and its kind of foreign call, and the
-- answer given. A row is inserted in the transaction that applies the
-- verdict, so there is none for a verdict that did not land, and one for
-- every verdict that did.
--
-- It names its key by value (scope, key, key_id, generation), not by a
-- foreign key to idem_keys: a verdict must outlive its key, whose row the
-- commit that finishes it, and then the reaper, make forget it. The reaper
-- never deletes a verdict; nothing in idem updates or deletes one (see
-- docs/operations.md, "Verdicts", for their retention). Of the answer a
-- verdict finished its key with, only the status and the body's length are
-- kept: the record lives far longer than the key, and a body (or a hash of
-- it, which a guess can be checked against) may hold what the key's
-- retention exists to forget.
--
-- The primary key leads with the scope so that the table can be distributed
-- by it, co-located with idem_keys (Citus layout): the verdict's insert then
-- runs on the shard of the key's own row, in the same transaction.
CREATE TABLE {{schema}}idem_verdicts (
    id              bigint      GENERATED ALWAYS AS IDENTITY,
    scope           text        NOT NULL,
    key             text        NOT NULL,
    key_id          bigint      NOT NULL,
    generation      int         NOT NULL,
    fence           bigint      NOT NULL,
    flow            text        NOT NULL,
    verdict         text        NOT NULL CHECK (verdict IN ('happened', 'not_happened', 'abandon')),
    phase           text        NOT NULL,
    foreign_kind    text        NOT NULL,
    recovery_point  text        NOT NULL,
    operator        text        NOT NULL CHECK (operator <> ''),
    reason          text        NOT NULL CHECK (reason <> ''),
    action          text        NOT NULL,
    answer_status   int,
    answer_bytes    int,
    session_user_name text      NOT NULL DEFAULT session_user,
    client_addr     inet                 DEFAULT inet_client_addr(),
    created_at      timestamptz NOT NULL,
    PRIMARY KEY (scope, id)
);

-- keys show reads a key's verdicts, newest first; pruning by age scans
-- created_at.
CREATE INDEX idem_verdicts_key_idx ON {{schema}}idem_verdicts (scope, key, id);
CREATE INDEX idem_verdicts_created_at_idx ON {{schema}}idem_verdicts (created_at);
