-- idem's Citus layout, for schema version 12: what `migrations.Config{Citus:
-- true}` (`idem migrate up --citus`) applies on a Citus coordinator, in the
-- same transaction, after the numbered migrations. See docs/scaling.md,
-- "Citus".
--
-- idem_keys and idem_leases are distributed by scope (text, as it is), and
-- co-located: every row of a scope, its key and its lease, lives on one
-- shard, so a per-shard unique index on (scope, key) is a global one and
-- every statement that names the scope runs on one worker. A business
-- table shares a phase's transaction on the same worker when it is
-- distributed by a text column holding the same scope value, co-located
-- with idem_keys (colocate_with => 'idem_keys').
--
-- The migrator sends the statements between "-- idem:step" lines one
-- string at a time: Citus propagates some commands to the workers with the
-- whole query string they came in, and a string of several commands is
-- refused there ("cannot insert multiple commands into a prepared
-- statement").
--
-- Citus requires every primary key, unique constraint and foreign key
-- between distributed tables to include the distribution column.
-- Citus runs the distributed-function commands below over one connection
-- per node; the whole layout must then be sequential.
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';

ALTER TABLE {{schema}}idem_leases DROP CONSTRAINT idem_leases_key_id_fkey;
ALTER TABLE {{schema}}idem_leases ADD COLUMN scope text;
UPDATE {{schema}}idem_leases l SET scope = k.scope FROM {{schema}}idem_keys k WHERE k.id = l.key_id;
ALTER TABLE {{schema}}idem_leases ALTER COLUMN scope SET NOT NULL;
ALTER TABLE {{schema}}idem_leases DROP CONSTRAINT idem_leases_pkey;
ALTER TABLE {{schema}}idem_leases ADD CONSTRAINT idem_leases_pkey PRIMARY KEY (scope, key_id);
ALTER TABLE {{schema}}idem_keys DROP CONSTRAINT idem_keys_pkey;
ALTER TABLE {{schema}}idem_keys ADD CONSTRAINT idem_keys_pkey PRIMARY KEY (scope, id);

-- Migration 0010's triggers notify on the node the row lives on, a worker,
-- where no store listens: stores on Citus poll for the keys their requests
-- wait for (pgstore does so by itself there). Triggers on distributed
-- tables also need citus.enable_unsafe_triggers.
DROP TRIGGER idem_leases_unlocked_v10 ON {{schema}}idem_leases;
DROP TRIGGER idem_keys_ended_v10 ON {{schema}}idem_keys;

SELECT create_distributed_table('{{schema}}idem_keys', 'scope');
SELECT create_distributed_table('{{schema}}idem_leases', 'scope', colocate_with => '{{schema}}idem_keys');
-- An operator's verdict is inserted in the transaction of its key's commit:
-- co-located, it lands on the same worker.
SELECT create_distributed_table('{{schema}}idem_verdicts', 'scope', colocate_with => '{{schema}}idem_keys');
-- Distributing copies a table's rows into its shards and leaves the local
-- copy on the coordinator's disk, invisible and never reaped (stored
-- params and responses among them): drop it.
SELECT truncate_local_data_after_distributing_table('{{schema}}idem_leases');
SELECT truncate_local_data_after_distributing_table('{{schema}}idem_keys');
SELECT truncate_local_data_after_distributing_table('{{schema}}idem_verdicts');
-- idem:step
ALTER TABLE {{schema}}idem_leases ADD CONSTRAINT idem_leases_key_fkey
    FOREIGN KEY (scope, key_id) REFERENCES {{schema}}idem_keys (scope, id) ON DELETE CASCADE;

-- idem_acquire_v11 of 0011 with the scope in the three statements that
-- found rows by id alone (the expired key's DELETE, the lease row's INSERT
-- and SELECT), so that, distributed by its p_scope argument, it runs whole
-- on the worker that holds the scope: one round trip from the application,
-- one from the coordinator to that worker. It keeps the migrator's
-- search_path: on the worker it runs with Citus's own, where the tables
-- named without a schema would not be found.
-- idem:step
CREATE OR REPLACE FUNCTION {{schema}}idem_acquire_v11(
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
SET search_path FROM CURRENT
AS $idem_acquire_v11$
#variable_conflict error
DECLARE
    v_now      timestamptz := coalesce(p_now, now());
    v_acquired text := 'none';
    v_found    boolean;
    v_generation int := 0;
    k {{schema}}idem_keys;
    l {{schema}}idem_leases;
BEGIN
    FOR attempt IN 1..2 LOOP
        SELECT * INTO k FROM {{schema}}idem_keys t WHERE t.scope = p_scope AND t.key = p_key;
        v_found := FOUND;
        EXIT WHEN v_found AND NOT (k.status = 'finished' AND k.expires_at <= v_now);
        IF p_no_create OR attempt = 2 THEN
            RETURN;
        END IF;

        -- As in 0011: a key another transaction is inserting is busy, not
        -- waited for. On a worker: every acquisition of the scope runs there.
        IF NOT pg_try_advisory_xact_lock(hashtextextended(
                length(p_scope)::text || ':' || p_scope || p_key,
                '{{schema}}idem_keys'::regclass::oid::bigint)) THEN
            RAISE EXCEPTION 'idem: key is being created by another transaction'
                USING ERRCODE = 'lock_not_available';
        END IF;

        IF v_found THEN
            DELETE FROM {{schema}}idem_keys d
            WHERE d.scope = p_scope AND d.id = k.id AND d.status = 'finished' AND d.expires_at <= v_now;
            v_generation := k.generation + 1;
        END IF;

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
            INSERT INTO {{schema}}idem_leases AS t (scope, key_id, fence, locked_at, lease_expires_at,
                holder_instance, holder_host, holder_pid, holder_boot, holder_fence)
            VALUES (p_scope, k.id, k.fence, v_now, v_now + p_lease * interval '1 microsecond',
                nullif(p_holder_instance, ''), nullif(p_holder_host, ''), nullif(p_holder_pid, 0),
                nullif(p_holder_boot, ''), k.fence)
            RETURNING * INTO l;
            v_acquired := 'created';
            EXIT;
        END IF;
    END LOOP;

    IF v_acquired = 'none' AND k.status <> 'finished' THEN
        SELECT * INTO l FROM {{schema}}idem_leases t WHERE t.scope = p_scope AND t.key_id = k.id;
    END IF;

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

-- idem:step
SELECT create_distributed_function(
    '{{schema}}idem_acquire_v11(timestamptz, text, text, text, text, text, bytea, bytea, text, bigint, boolean, text, text, text, int, text)',
    'p_scope', colocate_with := '{{schema}}idem_keys');
