-- Binaries of version 10 call idem_acquire_v9, which stays. A key some
-- transaction is creating in its first phase when this runs is created or
-- rolled back like any other: nothing a key stores depends on the function.
DROP FUNCTION {{schema}}idem_acquire_v11(timestamptz, text, text, text, text, text, bytea, bytea, text, bigint, boolean, text, text, text, int, text);
