-- Without the mark and the function, nothing notifies: a retry that waits
-- for a key in flight is woken by its process's polling instead, at most a
-- few seconds late. Nothing a key stores depends on them, so nothing refuses.
-- But this release's finishing commit, release and parking call the
-- function: a binary of this release fails every one of them on a schema
-- migrated down ("function idem_notify_waiters_v10(bigint) does not
-- exist"). Deploy the release before first, then migrate down.
DROP FUNCTION {{schema}}idem_notify_waiters_v10(bigint);
ALTER TABLE {{schema}}idem_leases DROP COLUMN waited_at;
