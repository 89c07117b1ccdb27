-- Without payload_fingerprint, keys compare by fingerprint, which holds what
-- the earlier releases compare (the input scheme), or, for keys made before
-- this migration and keys that replaced an expired one, the payload
-- fingerprint itself. Downstream keys derive from fingerprint either way, so
-- no key in flight sends anything different, and nothing refuses. A retry of
-- a key made here, across a deploy that changed the flow's input type, may
-- then be answered 422 (key reused), as before this migration.
DROP FUNCTION {{schema}}idem_acquire_v9(timestamptz, text, text, text, text, text, bytea, bytea, text, bigint, boolean, text, text, text, int, text);
ALTER TABLE {{schema}}idem_keys DROP COLUMN payload_fingerprint;
