-- idem:floor 7 (it only adds nullable columns and a new function;
--   idem_acquire_v7 stays as it was).
-- A lease names its holder: the process that took it, and, when the
-- application gives its instances stable names (pgstore.Config.Instance: a
-- pod name, a host name with one process on it), the instance. A process
-- that restarts under the same instance name takes over, on the next
-- request for them, the keys its previous incarnation held when it died,
-- instead of answering "in progress" until their lease runs out: an
-- instance name is unique among live processes, so a lease of the same
-- instance taken by another boot is a dead process's. The takeover moves
-- the fence, as every takeover does, so a writer that is somehow still
-- alive fails its next guarded statement.
--
-- holder_instance is the instance name (NULL when the application names
-- none: such a lease is never taken over before it expires), holder_host
-- and holder_pid say where the holder ran (for operators: keys show),
-- holder_boot tells one process of an instance from the next. holder_fence
-- is the fence the holder took the lease at: the columns describe the lease
-- only while it equals the lease's fence. Binaries of the previous version
-- move the fence without writing these columns, so a lease they take over
-- during a rolling upgrade reads as held by nobody known, and no restarted
-- instance takes it from them. Nullable columns without a default rewrite
-- nothing.
ALTER TABLE {{schema}}idem_leases
    ADD COLUMN holder_instance text,
    ADD COLUMN holder_host     text,
    ADD COLUMN holder_pid      int,
    ADD COLUMN holder_boot     text,
    ADD COLUMN holder_fence    bigint;

-- idem_acquire_v8 is idem_acquire_v7 (see its migration, and 0005's for how
-- the acquisition works) that writes the holder on the lease row of a key it
-- creates, and returns the holder as four last columns (empty unless they
-- describe the lease). It is a new function, not a replacement, so that
-- instances of the previous version, which call idem_acquire_v7, keep
-- working during a rolling upgrade (the keys they create name no holder).
CREATE FUNCTION {{schema}}idem_acquire_v8(
    p_now timestamptz, p_scope text, p_key text, p_flow text, p_method text, p_path text,
    p_fingerprint bytea, p_params text, p_lease bigint, p_no_create boolean, p_params_key_id text,
    p_holder_instance text, p_holder_host text, p_holder_pid int, p_holder_boot text)
RETURNS TABLE (
    acquired text, db_now timestamptz,
    id bigint, request_id text, downstream_scheme smallint, scope text, key text, flow text, method text, path text,
    fingerprint bytea, params jsonb, status text, recovery_point text, checkpoint jsonb,
    foreign_mark text, locked_at timestamptz, lease_expires_at timestamptz, fence bigint,
    response_status int, response_headers jsonb, response_body bytea, attempts int, last_error text,
    created_at timestamptz, last_run_at timestamptz, finished_at timestamptz, expires_at timestamptz,
    params_key_id text, response_key_id text, generation int,
    holder_instance text, holder_host text, holder_pid int, holder_boot text)
LANGUAGE plpgsql
AS $idem_acquire_v8$
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
        INSERT INTO {{schema}}idem_keys AS t
            (scope, key, flow, method, path, fingerprint, params, created_at, last_run_at, params_key_id, generation)
        VALUES (p_scope, p_key, p_flow, p_method, p_path, p_fingerprint, p_params::jsonb, v_now, v_now,
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
        CASE WHEN k.status <> 'finished' AND l.holder_fence = l.fence THEN coalesce(l.holder_boot, '') ELSE '' END;
END
$idem_acquire_v8$;
