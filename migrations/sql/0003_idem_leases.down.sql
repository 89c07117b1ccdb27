ALTER TABLE {{schema}}idem_keys
    ADD COLUMN locked_at timestamptz,
    ADD COLUMN lease_expires_at timestamptz,
    ADD COLUMN foreign_mark text;
-- A mark made at an earlier recovery point was retired by a commit; the old
-- schema cleared such marks instead.
UPDATE {{schema}}idem_keys k
SET locked_at = l.locked_at, lease_expires_at = l.lease_expires_at,
    foreign_mark = CASE WHEN l.foreign_mark_after = k.recovery_point THEN l.foreign_mark END
FROM {{schema}}idem_leases l
WHERE l.key_id = k.id AND k.status <> 'finished';
DROP TABLE {{schema}}idem_leases;
