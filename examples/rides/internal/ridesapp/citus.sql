-- The rides tables on Citus (MigrateCitus), after schema.sql, once: the
-- business rows a phase writes live on the worker that holds the phase's
-- key. rides and audit_records get the key's scope ('user:<id>', as the
-- handler derives it) and are distributed by it, co-located with idem's
-- tables; users, which every ride joins, becomes a reference table (a copy
-- on every worker). Citus requires every primary key and unique constraint
-- of a distributed table to include its distribution column, and refuses
-- ON DELETE SET NULL on a foreign key that includes it: a ride keeps its
-- key's id with no foreign key to idem_keys (MigrateCitus creates rides
-- without schema.sql's), and the reaper leaves it the id of a key that is
-- gone. receipts, written by the queue's worker outside
-- any phase, stays a table of the coordinator, without its foreign key to
-- rides or users (a table of the coordinator that references a reference
-- table would be made a Citus table, which its identity column prevents).
-- The user foreign keys of rides and audit_records are dropped while users
-- becomes a reference table and made again once they are distributed, for
-- the same reason. Each statement is sent on its own (see migrate.go).
ALTER TABLE {{schema}}receipts DROP CONSTRAINT receipts_ride_id_fkey;
ALTER TABLE {{schema}}receipts DROP CONSTRAINT receipts_user_id_fkey;
ALTER TABLE {{schema}}rides DROP CONSTRAINT rides_user_id_fkey;
ALTER TABLE {{schema}}audit_records DROP CONSTRAINT audit_records_user_id_fkey;
SELECT create_reference_table('{{schema}}users');
ALTER TABLE {{schema}}rides ADD COLUMN scope text;
UPDATE {{schema}}rides SET scope = 'user:' || user_id;
ALTER TABLE {{schema}}rides ALTER COLUMN scope SET NOT NULL;
ALTER TABLE {{schema}}rides DROP CONSTRAINT rides_pkey;
ALTER TABLE {{schema}}rides ADD CONSTRAINT rides_pkey PRIMARY KEY (scope, id);
ALTER TABLE {{schema}}rides DROP CONSTRAINT rides_idempotency_key_id_key;
ALTER TABLE {{schema}}rides ADD CONSTRAINT rides_idempotency_key_id_key UNIQUE (scope, idempotency_key_id);
ALTER TABLE {{schema}}rides DROP CONSTRAINT rides_charge_id_key;
ALTER TABLE {{schema}}rides ADD CONSTRAINT rides_charge_id_key UNIQUE (scope, charge_id);
SELECT create_distributed_table('{{schema}}rides', 'scope', colocate_with => '{{schema}}idem_keys');
ALTER TABLE {{schema}}audit_records ADD COLUMN scope text;
UPDATE {{schema}}audit_records SET scope = 'user:' || user_id;
ALTER TABLE {{schema}}audit_records ALTER COLUMN scope SET NOT NULL;
ALTER TABLE {{schema}}audit_records DROP CONSTRAINT audit_records_pkey;
ALTER TABLE {{schema}}audit_records ADD CONSTRAINT audit_records_pkey PRIMARY KEY (scope, id);
SELECT create_distributed_table('{{schema}}audit_records', 'scope', colocate_with => '{{schema}}idem_keys');
ALTER TABLE {{schema}}rides ADD CONSTRAINT rides_user_id_fkey
    FOREIGN KEY (user_id) REFERENCES {{schema}}users (id) ON DELETE RESTRICT;
ALTER TABLE {{schema}}audit_records ADD CONSTRAINT audit_records_user_id_fkey
    FOREIGN KEY (user_id) REFERENCES {{schema}}users (id) ON DELETE RESTRICT;
