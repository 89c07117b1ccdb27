-- Without the mark, the triggers and the functions, nothing notifies: a
-- retry that waits for a key in flight is woken by its process's own checks
-- of the key instead, a few seconds late at most. Nothing a key stores
-- depends on them, so nothing refuses.
DROP TRIGGER idem_leases_unlocked_v10 ON {{schema}}idem_leases;
DROP TRIGGER idem_keys_ended_v10 ON {{schema}}idem_keys;
DROP FUNCTION {{schema}}idem_leases_unlocked_v10();
DROP FUNCTION {{schema}}idem_keys_ended_v10();
DROP FUNCTION {{schema}}idem_notify_waiters_v10(bigint);
ALTER TABLE {{schema}}idem_leases DROP COLUMN waited_at;
