-- Downstream idempotency keys used to be derived from request_id, which a
-- failover to a standby that had not received the row loses: the retry made a
-- new row, a new request_id, and a new downstream key the provider did not
-- recognise. Keys created from now on derive them from the request itself
-- (scope, key, flow, fingerprint, phase). Rows that exist when this runs keep
-- the old scheme (1), so a call already made for a key in flight is still
-- recognised by its provider; new rows get 2. Adding the column with a
-- constant default rewrites nothing.
ALTER TABLE {{schema}}idem_keys ADD COLUMN downstream_scheme smallint NOT NULL DEFAULT 1;
ALTER TABLE {{schema}}idem_keys ALTER COLUMN downstream_scheme SET DEFAULT 2;
