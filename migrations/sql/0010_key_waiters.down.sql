-- Without the mark and the function, nothing notifies: a retry that waits
-- for a key in flight is woken by its process's polling instead, at most a
-- few seconds late. Nothing a key stores depends on them, so nothing refuses.
DROP FUNCTION {{schema}}idem_notify_waiters_v10(bigint);
ALTER TABLE {{schema}}idem_leases DROP COLUMN waited_at;
