-- The column checks of idem_keys become domains (all but scope's, see
-- below). Postgres rebuilds every CHECK constraint of a table from its
-- stored expression on each execution of a statement that inserts or
-- updates a row, whichever columns the statement sets: the single-column
-- checks cost about half of a single-row update of the key row. A domain's check is kept ready per connection and runs only on
-- a value assigned to a column of that domain: key, flow, method and path
-- are checked when a key is created, status and recovery_point when a
-- statement sets them. The rules are the same as before. The check that
-- spans columns stays a table check, and so does scope's: a table
-- distributed by scope (Citus, see docs/scaling.md) cannot change its
-- distribution column's type.
--
-- The domains get their checks after the columns change type: a column
-- changed to a domain that has a check is rewritten, one changed to a domain
-- without one is not. The checks are NOT VALID because the table checks
-- dropped here, in the same transaction, held every existing row to the same
-- rules; they hold every value written from now on. What remains, under an
-- exclusive lock on idem_keys, is a scan that validates the table check
-- naming status again, and a rebuild of the two partial indexes whose
-- predicates name it.
CREATE DOMAIN {{schema}}idem_key AS text;
CREATE DOMAIN {{schema}}idem_flow AS text;
CREATE DOMAIN {{schema}}idem_method AS text;
CREATE DOMAIN {{schema}}idem_path AS text;
CREATE DOMAIN {{schema}}idem_status AS text;
CREATE DOMAIN {{schema}}idem_recovery_point AS text;

ALTER TABLE {{schema}}idem_keys
    DROP CONSTRAINT idem_keys_key_check,
    DROP CONSTRAINT idem_keys_flow_check,
    DROP CONSTRAINT idem_keys_method_check,
    DROP CONSTRAINT idem_keys_path_check,
    DROP CONSTRAINT idem_keys_status_check,
    DROP CONSTRAINT idem_keys_recovery_point_check,
    ALTER COLUMN key TYPE {{schema}}idem_key,
    ALTER COLUMN flow TYPE {{schema}}idem_flow,
    ALTER COLUMN method TYPE {{schema}}idem_method,
    ALTER COLUMN path TYPE {{schema}}idem_path,
    ALTER COLUMN status TYPE {{schema}}idem_status,
    ALTER COLUMN recovery_point TYPE {{schema}}idem_recovery_point;

ALTER DOMAIN {{schema}}idem_key ADD CONSTRAINT idem_key_check CHECK (char_length(VALUE) BETWEEN 1 AND 255) NOT VALID;
ALTER DOMAIN {{schema}}idem_flow ADD CONSTRAINT idem_flow_check CHECK (char_length(VALUE) BETWEEN 1 AND 128) NOT VALID;
ALTER DOMAIN {{schema}}idem_method ADD CONSTRAINT idem_method_check CHECK (char_length(VALUE) <= 16) NOT VALID;
ALTER DOMAIN {{schema}}idem_path ADD CONSTRAINT idem_path_check CHECK (char_length(VALUE) <= 2048) NOT VALID;
ALTER DOMAIN {{schema}}idem_status ADD CONSTRAINT idem_status_check
    CHECK (VALUE IN ('running', 'finished', 'needs_reconcile')) NOT VALID;
ALTER DOMAIN {{schema}}idem_recovery_point ADD CONSTRAINT idem_recovery_point_check CHECK (char_length(VALUE) <= 64) NOT VALID;

-- A session that has run idem_acquire keeps the function compiled with the
-- columns' old types and would fail every later call; touching the function's
-- catalog row makes every session compile it afresh.
ALTER FUNCTION {{schema}}idem_acquire(timestamptz, text, text, text, text, text, bytea, text, bigint, boolean, text) VOLATILE;
