-- idem_leases holds what a key's holder writes while its phases run: the
-- lease, which heartbeats renew from another connection, and the foreign
-- mark, which a not-idempotent phase writes just before its call. On
-- idem_keys, each of those writes made a row version newer than the running
-- phase's snapshot, so under repeatable read or serializable the phase's
-- guarded commit (an UPDATE of that row) failed with a serialization failure:
-- a phase longer than the heartbeat interval could never commit, and a
-- not-idempotent phase that ran a statement before its call always went to
-- needs_reconcile. A phase commit now updates only idem_keys, which nothing
-- but a takeover or a forced unlock (which move the fence, and must conflict)
-- writes while the key is held.
--
-- A key gets its row when it is created (or, for keys that predate this
-- table, here, if unfinished). The row means nothing once the key finishes:
-- the finishing commit cannot delete it without conflicting with heartbeats
-- either, so readers ignore it, and reaping the key deletes it.
CREATE TABLE {{schema}}idem_leases (
    key_id             bigint      PRIMARY KEY REFERENCES {{schema}}idem_keys (id) ON DELETE CASCADE,
    -- fence is the key's fence, written with it by every statement that moves
    -- it (acquisition, takeover, reconcile claim, forced unlock), so that
    -- heartbeats and marks are guarded by this row alone.
    fence              bigint      NOT NULL,
    locked_at          timestamptz,
    lease_expires_at   timestamptz,
    -- foreign_mark names the phase whose not-idempotent call may have
    -- happened; foreign_mark_after is the key's recovery point when it was
    -- made. The mark counts only while the key is unfinished and still at
    -- that recovery point: the phase's own commit moves the recovery point,
    -- which retires the mark without writing this row.
    foreign_mark       text,
    foreign_mark_after text
);

INSERT INTO {{schema}}idem_leases (key_id, fence, locked_at, lease_expires_at, foreign_mark, foreign_mark_after)
SELECT id, fence, locked_at, lease_expires_at, foreign_mark,
       CASE WHEN foreign_mark IS NOT NULL THEN recovery_point END
FROM {{schema}}idem_keys
WHERE status <> 'finished';

-- Binaries that still use these columns fail on every statement from here
-- on, rather than keep a lease or a mark no new binary would see.
ALTER TABLE {{schema}}idem_keys
    DROP COLUMN locked_at,
    DROP COLUMN lease_expires_at,
    DROP COLUMN foreign_mark;
