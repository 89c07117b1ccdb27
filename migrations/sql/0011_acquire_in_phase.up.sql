-- idem:floor 10 (it only adds a function; idem_acquire_v9 stays as it was).
-- A new key's acquisition can share the transaction of its request's first
-- phase, so that the key row, the phase's writes and the recovery point
-- commit once (pgstore's AcquireInPhase): one commit fewer per request, and
-- a crash before that commit leaves nothing behind. idem_acquire_v11 is
-- idem_acquire_v9 with one change, made for that: before it inserts a key
-- (or replaces an expired one) it takes the key's transaction-level
-- advisory lock without waiting, and fails with lock_not_available when
-- another transaction holds it. Called in autocommit, the lock is held for
-- the statement; called in a phase's transaction, until that commits.
--
-- Binaries of version 10 and earlier call idem_acquire_v9, which takes no
-- advisory lock: during a rolling deploy, an older binary's acquisition of a
-- key a newer one is creating in its first phase waits for that phase to
-- commit (ON CONFLICT), then answers as before, or gives up at its
-- statement timeout (a 503 its client retries). Nothing is lost or run
-- twice.
CREATE FUNCTION {{schema}}idem_acquire_v11(
    p_now timestamptz, p_scope text, p_key text, p_flow text, p_method text, p_path text,
    p_fingerprint bytea, p_payload_fingerprint bytea, p_params text, p_lease bigint, p_no_create boolean, p_params_key_id text,
    p_holder_instance text, p_holder_host text, p_holder_pid int, p_holder_boot text)
RETURNS TABLE (
    acquired text, db_now timestamptz,
    id bigint, request_id text, downstream_scheme smallint, scope text, key text, flow text, method text, path text,
    fingerprint bytea, params jsonb, status text, recovery_point text, checkpoint jsonb,
    foreign_mark text, locked_at timestamptz, lease_expires_at timestamptz, fence bigint,
    response_status int, response_headers jsonb, response_body bytea, attempts int, last_error text,
    created_at timestamptz, last_run_at timestamptz, finished_at timestamptz, expires_at timestamptz,
    params_key_id text, response_key_id text, generation int,
    holder_instance text, holder_host text, holder_pid int, holder_boot text,
    payload_fingerprint bytea)
LANGUAGE plpgsql
AS $idem_acquire_v11$
#variable_conflict error
DECLARE
    v_now      timestamptz := coalesce(p_now, now());
    v_acquired text := 'none';
    v_found    boolean;
    -- The generation of the key inserted: one more than the expired key it
    -- replaces, 0 for a key never seen.
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
        -- A live key: report it. A finished key past its expiry is absent,
        -- whether or not the reaper has run, and is never replayed.
        EXIT WHEN v_found AND NOT (k.status = 'finished' AND k.expires_at <= v_now);
        IF p_no_create OR attempt = 2 THEN
            -- NoCreate leaves an expired key as it is. A second read that
            -- finds nothing live (the winner's key already reaped, say):
            -- the caller's next call sees what happened.
            RETURN;
        END IF;

        -- Absent or expired: this call would insert the key. Another
        -- transaction may be inserting it right now, in the transaction of
        -- the first phase of its request (pgstore's AcquireInPhase), whose
        -- row this snapshot cannot see and whose commit may be a whole
        -- phase away. ON CONFLICT would wait for that commit; a duplicate
        -- must hear "in progress" at once instead. Every inserter takes the
        -- key's advisory lock for its transaction first, without waiting:
        -- one that finds it taken raises lock_not_available (55P03), which
        -- the store reports as a key busy being created. Keys are hashed
        -- with their scope's length, so no two (scope, key) pairs spell the
        -- same string; a collision of two live keys' hashes only answers
        -- one of them "in progress" for a moment. Advisory locks are the
        -- database's, not the schema's: the hash is seeded with this
        -- schema's key table, so that the same key in two schemas of one
        -- database (two services, or parallel tests) is two locks.
        IF NOT pg_try_advisory_xact_lock(hashtextextended(
                length(p_scope)::text || ':' || p_scope || p_key,
                '{{schema}}idem_keys'::regclass::oid::bigint)) THEN
            RAISE EXCEPTION 'idem: key is being created by another transaction'
                USING ERRCODE = 'lock_not_available';
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
            v_generation := k.generation + 1;
        END IF;

        -- Absent: insert the key, and its lease row, locked. A row this
        -- transaction deleted is no conflict. A concurrent insert of the same
        -- key is: ON CONFLICT waits for the other transaction and then does
        -- nothing, rather than raise a unique violation that would abort the
        -- caller. Under read committed the second read then sees the winner's
        -- key; under repeatable read or serializable a winner the snapshot
        -- cannot see is a serialization failure instead, and the caller calls
        -- again.
        --
        -- The key gets both fingerprints (see this migration's header), and
        -- the downstream scheme written out, not left to the column's
        -- default: what a key sends downstream never depends on a default
        -- that a migration (or its revert) may change.
        INSERT INTO {{schema}}idem_keys AS t
            (scope, key, flow, method, path, fingerprint, payload_fingerprint, downstream_scheme,
             params, created_at, last_run_at, params_key_id, generation)
        VALUES (p_scope, p_key, p_flow, p_method, p_path,
                CASE WHEN v_generation > 0 AND p_payload_fingerprint IS NOT NULL
                     THEN '\x03'::bytea || sha256(p_payload_fingerprint || convert_to(v_generation::text, 'UTF8'))
                     ELSE coalesce(p_fingerprint, p_payload_fingerprint) END,
                p_payload_fingerprint,
                CASE WHEN v_generation > 0 AND p_payload_fingerprint IS NOT NULL THEN 3 ELSE 2 END,
                p_params::jsonb, v_now, v_now,
                nullif(p_params_key_id, ''), v_generation)
        ON CONFLICT ON CONSTRAINT idem_keys_scope_key DO NOTHING
        RETURNING * INTO k;
        IF FOUND THEN
            INSERT INTO {{schema}}idem_leases AS t (key_id, fence, locked_at, lease_expires_at,
                holder_instance, holder_host, holder_pid, holder_boot, holder_fence)
            VALUES (k.id, k.fence, v_now, v_now + p_lease * interval '1 microsecond',
                nullif(p_holder_instance, ''), nullif(p_holder_host, ''), nullif(p_holder_pid, 0),
                nullif(p_holder_boot, ''), k.fence)
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
        coalesce(k.params_key_id, ''), coalesce(k.response_key_id, ''), k.generation,
        CASE WHEN k.status <> 'finished' AND l.holder_fence = l.fence THEN coalesce(l.holder_instance, '') ELSE '' END,
        CASE WHEN k.status <> 'finished' AND l.holder_fence = l.fence THEN coalesce(l.holder_host, '') ELSE '' END,
        CASE WHEN k.status <> 'finished' AND l.holder_fence = l.fence THEN coalesce(l.holder_pid, 0) ELSE 0 END,
        CASE WHEN k.status <> 'finished' AND l.holder_fence = l.fence THEN coalesce(l.holder_boot, '') ELSE '' END,
        k.payload_fingerprint;
END
$idem_acquire_v11$;
