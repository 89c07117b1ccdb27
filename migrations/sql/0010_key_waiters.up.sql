-- idem:floor 9 (it only adds a nullable column, functions and triggers;
--   every statement of the previous release stays as it was).
-- A retry may wait for the request already running with its key (Prefer:
-- wait over HTTP, idem.Request.Wait) instead of being answered "in
-- progress" at once, and is woken when the key finishes on any instance:
-- each process LISTENs on one channel per schema and fans the wake-ups out
-- to its waiters in memory.
--
-- NOTIFY takes a cluster-wide lock at commit, so keys nobody waits for send
-- nothing. A process that waits for a key marks it once, however many of
-- its requests wait: waited_at is when the key was first waited for (NULL:
-- never). It is on the lease row, which phase commits do not write, so a
-- mark never conflicts with a phase at repeatable read. A nullable column
-- without a default rewrites nothing.
ALTER TABLE {{schema}}idem_leases ADD COLUMN waited_at timestamptz;

-- idem_notify_waiters_v10 sends the key's id (never the key: keys are
-- tenants' data) on the schema's channel, "idem_finished:" followed by the
-- schema's name, or by its md5 when that would be longer than a channel
-- name may be (63 bytes), when the key's lease row is marked, and returns
-- whether it did. The notification goes out when the caller's transaction
-- commits, and not at all if it rolls back; the same one twice in a
-- transaction goes out once. It is VOLATILE, so under read committed its
-- query sees a mark committed while the calling statement waited for the
-- key's row lock (a waiter's mark locks the progress row FOR SHARE, which
-- the finishing update waits for).
CREATE FUNCTION {{schema}}idem_notify_waiters_v10(p_key bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $idem_notify_waiters_v10$
DECLARE
    v_schema  text;
    v_channel text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {{schema}}idem_leases t WHERE t.key_id = p_key AND t.waited_at IS NOT NULL) THEN
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
$idem_notify_waiters_v10$;

-- The attempt that holds a key ends when the key leaves status running (a
-- phase finishes it, or parks it for reconciliation) or when its lease is
-- unlocked (a failed phase releases it, an operator unlocks it): triggers,
-- not the statements, notify, so that the statements stay as the previous
-- release has them, and its instances notify too during a rolling
-- upgrade. Their conditions are checked row by row at no cost; the
-- function runs only for an attempt that ends.
CREATE FUNCTION {{schema}}idem_keys_ended_v10()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
AS $idem_keys_ended_v10$
BEGIN
    PERFORM {{schema}}idem_notify_waiters_v10(NEW.id);
    RETURN NULL;
END
$idem_keys_ended_v10$;

CREATE FUNCTION {{schema}}idem_leases_unlocked_v10()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
AS $idem_leases_unlocked_v10$
BEGIN
    PERFORM {{schema}}idem_notify_waiters_v10(NEW.key_id);
    RETURN NULL;
END
$idem_leases_unlocked_v10$;

CREATE TRIGGER idem_keys_ended_v10 AFTER UPDATE OF status ON {{schema}}idem_keys
    FOR EACH ROW WHEN (OLD.status::text = 'running' AND NEW.status::text <> 'running')
    EXECUTE FUNCTION {{schema}}idem_keys_ended_v10();

CREATE TRIGGER idem_leases_unlocked_v10 AFTER UPDATE OF locked_at ON {{schema}}idem_leases
    FOR EACH ROW WHEN (OLD.locked_at IS NOT NULL AND NEW.locked_at IS NULL AND NEW.waited_at IS NOT NULL)
    EXECUTE FUNCTION {{schema}}idem_leases_unlocked_v10();
