-- Version 4's code acquires keys with a statement of its own and does not
-- know this function. Code that calls it refuses to start on version 4.
DROP FUNCTION {{schema}}idem_acquire(timestamptz, text, text, text, text, text, bytea, text, bigint, boolean, text);
