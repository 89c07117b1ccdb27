-- Back to v0.1.0's version 6. Refused (SQLSTATE IDEM1) while any key is
-- unfinished: v0.1.0 would resume it with other downstream idempotency keys.
-- Keys finished under v0.2 stay; a retry of one under v0.1.0 compares
-- fingerprints of another scheme and is answered 422 (nothing runs) until
-- the key expires.
-- Dropping the table would forget every operator's verdict, which idem
-- keeps for good: refuse while any is recorded (SQLSTATE IDEM1,
-- migrations.ErrRefused). Export them, delete them, then revert. The table
-- is locked first, so that no verdict commits between the check and the
-- drop.
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

LOCK TABLE {{schema}}idem_verdicts IN ACCESS EXCLUSIVE MODE;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM {{schema}}idem_verdicts) THEN
        RAISE EXCEPTION 'idem: idem_verdicts holds operators'' verdicts, kept for good; reverting 0007 would drop them: export them and delete them first'
            USING ERRCODE = 'IDEM1';
    END IF;
END
$$;
DROP TABLE {{schema}}idem_verdicts;

LOCK TABLE {{schema}}idem_keys, {{schema}}idem_leases IN ACCESS EXCLUSIVE MODE;

DO $$
DECLARE
    n bigint;
BEGIN
    SELECT count(*) INTO n FROM {{schema}}idem_keys WHERE status <> 'finished';
    IF n > 0 THEN
        RAISE EXCEPTION 'idem: % keys are unfinished; v0.1.0 cannot resume keys v0.2 started: let them finish first', n
            USING ERRCODE = 'IDEM1';
    END IF;
END
$$;

DROP TRIGGER idem_leases_unlocked ON {{schema}}idem_leases;
DROP FUNCTION {{schema}}idem_leases_unlocked();
DROP FUNCTION {{schema}}idem_notify_waiters(text, bigint);
DROP FUNCTION {{schema}}idem_acquire(timestamptz, text, text, text, text, text, bytea, text, bigint, boolean, text,
    text, text, int, text, bigint);
DROP TABLE {{schema}}idem_stragglers;
DROP TABLE {{schema}}idem_sweep;
DROP TABLE {{schema}}idem_leases;

-- The primary key goes back to (id), business tables' foreign keys with it
-- (see the up migration).
DO $$
DECLARE
    fk record;
    again text[] := '{}';
    stmt text;
BEGIN
    FOR fk IN SELECT conrelid::regclass AS tbl, conname, pg_get_constraintdef(oid) AS def
              FROM pg_catalog.pg_constraint
              WHERE contype = 'f' AND confrelid = '{{schema}}idem_keys'::regclass
                AND conparentid = 0 LOOP
        again := again || format('ALTER TABLE %s ADD CONSTRAINT %I %s', fk.tbl, fk.conname, fk.def);
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', fk.tbl, fk.conname);
    END LOOP;
    ALTER TABLE {{schema}}idem_keys DROP CONSTRAINT idem_keys_pkey, DROP CONSTRAINT idem_keys_id;
    ALTER TABLE {{schema}}idem_keys ADD CONSTRAINT idem_keys_pkey PRIMARY KEY (id);
    FOREACH stmt IN ARRAY again LOOP
        EXECUTE stmt;
    END LOOP;
END
$$;

ALTER TABLE {{schema}}idem_keys
    DROP COLUMN reap_after,
    DROP COLUMN generation,
    DROP COLUMN holder_pid,
    DROP COLUMN locked_at,
    DROP COLUMN lease_expires_at,
    DROP COLUMN holder_instance,
    DROP COLUMN holder_host,
    DROP COLUMN holder_boot,
    ADD COLUMN request_id uuid NOT NULL DEFAULT gen_random_uuid(),
    ADD COLUMN downstream_scheme smallint NOT NULL DEFAULT 2;

-- v0.1.0's indexes of finished and unfinished keys (DROP COLUMN took the
-- reaper's index on reap_after with it).
CREATE INDEX idem_keys_reap ON {{schema}}idem_keys (expires_at) WHERE status = 'finished';
CREATE INDEX idem_keys_unfinished ON {{schema}}idem_keys (id) WHERE status <> 'finished';

-- Version 3's lease table, empty: every key is finished.
CREATE TABLE {{schema}}idem_leases (
    key_id             bigint      PRIMARY KEY REFERENCES {{schema}}idem_keys (id) ON DELETE CASCADE,
    fence              bigint      NOT NULL,
    locked_at          timestamptz,
    lease_expires_at   timestamptz,
    foreign_mark       text,
    foreign_mark_after text
);

-- v0.1.0's idem_acquire, as migration 0005 made it.
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
#variable_conflict error
DECLARE
    v_now      timestamptz := coalesce(p_now, now());
    v_acquired text := 'none';
    v_found    boolean;
    -- The key's progress row and lease row (all NULL until read).
    k {{schema}}idem_keys;
    l {{schema}}idem_leases;
BEGIN
    -- At most two reads: the second follows an insert that lost to a
    -- concurrent one, and finds the winner's key.
    FOR attempt IN 1..2 LOOP
        SELECT * INTO k FROM {{schema}}idem_keys t WHERE t.scope = p_scope AND t.key = p_key;
        v_found := FOUND;
        -- A live key: report it. A finished key past its expiry is absent,
        -- whether or not the reaper has run, and is never replayed.
        EXIT WHEN v_found AND NOT (k.status = 'finished' AND k.expires_at <= v_now);
        IF p_no_create OR attempt = 2 THEN
            -- NoCreate leaves an expired key as it is. A second read that
            -- finds nothing live (the winner's key already reaped, say):
            -- the caller's next call sees what happened.
            RETURN;
        END IF;

        IF v_found THEN
            -- Expired: delete it (its lease row goes with it, ON DELETE
            -- CASCADE) so that the insert takes its place in this
            -- transaction. The conditions are re-checked on the row's newest
            -- version: if a concurrent acquirer or the reaper deleted it
            -- first, this deletes nothing and the insert meets that
            -- acquirer's new key, or finds the way clear. Under repeatable
            -- read, a row deleted since the snapshot is a serialization
            -- failure, which the caller retries.
            DELETE FROM {{schema}}idem_keys d
            WHERE d.id = k.id AND d.status = 'finished' AND d.expires_at <= v_now;
        END IF;

        -- Absent: insert the key, and its lease row, locked. A row this
        -- transaction deleted is no conflict. A concurrent insert of the same
        -- key is: ON CONFLICT waits for the other transaction and then does
        -- nothing, rather than raise a unique violation that would abort the
        -- caller. Under read committed the second read then sees the winner's
        -- key; under repeatable read or serializable a winner the snapshot
        -- cannot see is a serialization failure instead, and the caller calls
        -- again.
        INSERT INTO {{schema}}idem_keys AS t
            (scope, key, flow, method, path, fingerprint, params, created_at, last_run_at, params_key_id)
        VALUES (p_scope, p_key, p_flow, p_method, p_path, p_fingerprint, p_params::jsonb, v_now, v_now,
                nullif(p_params_key_id, ''))
        ON CONFLICT ON CONSTRAINT idem_keys_scope_key DO NOTHING
        RETURNING * INTO k;
        IF FOUND THEN
            INSERT INTO {{schema}}idem_leases AS t (key_id, fence, locked_at, lease_expires_at)
            VALUES (k.id, k.fence, v_now, v_now + p_lease * interval '1 microsecond')
            RETURNING * INTO l;
            v_acquired := 'created';
            EXIT;
        END IF;
    END LOOP;

    -- A finished key's lease row means nothing (the record hides it), and is
    -- not read. An unfinished key's is read now: under read committed from a
    -- snapshot a little newer than the progress row's, which is harmless, as
    -- the runner only reports such a key, or takes it over with a statement
    -- that checks everything again under the row locks.
    IF v_acquired = 'none' AND k.status <> 'finished' THEN
        SELECT * INTO l FROM {{schema}}idem_leases t WHERE t.key_id = k.id;
    END IF;

    -- pgstore's recordColumns over k and l, except for a finished key's
    -- params and checkpoint. The columns that version 6 makes domains over
    -- text are cast to text: RETURN QUERY needs the declared types exactly.
    RETURN QUERY SELECT v_acquired, v_now,
        k.id, k.request_id::text, k.downstream_scheme, k.scope, k.key::text, k.flow::text, k.method::text, k.path::text,
        k.fingerprint, CASE WHEN k.status <> 'finished' THEN k.params END,
        k.status::text, k.recovery_point::text, CASE WHEN k.status <> 'finished' THEN k.checkpoint END,
        CASE WHEN k.status <> 'finished' AND l.foreign_mark_after = k.recovery_point
             THEN coalesce(l.foreign_mark, '') ELSE '' END,
        CASE WHEN k.status <> 'finished' THEN l.locked_at END,
        CASE WHEN k.status <> 'finished' THEN l.lease_expires_at END, k.fence,
        coalesce(k.response_status, 0), coalesce(k.response_headers, '{}'),
        k.response_body, k.attempts, coalesce(k.last_error, ''),
        k.created_at, k.last_run_at, k.finished_at, k.expires_at,
        coalesce(k.params_key_id, ''), coalesce(k.response_key_id, '');
END
$idem_acquire$;
