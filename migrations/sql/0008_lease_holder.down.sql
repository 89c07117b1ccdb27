-- The holder columns only describe leases (and let a restarted instance
-- resume its keys early); without them a lease is held, as before 0008,
-- until it expires. Nothing a key sends depends on them, so nothing refuses.
DROP FUNCTION {{schema}}idem_acquire_v8(timestamptz, text, text, text, text, text, bytea, text, bigint, boolean, text, text, text, int, text);
ALTER TABLE {{schema}}idem_leases
    DROP COLUMN holder_instance,
    DROP COLUMN holder_host,
    DROP COLUMN holder_pid,
    DROP COLUMN holder_boot,
    DROP COLUMN holder_fence;
