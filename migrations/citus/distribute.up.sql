-- idem's Citus layout: what `migrations.Config{Citus: true}` (`idem migrate
-- up --citus`) applies on a Citus coordinator, in the same transaction,
-- after the numbered migrations. See docs/scaling.md, "Citus".
--
-- The tables already have Citus's shape (the scope in every primary and
-- foreign key), and every statement of the store names the scope: this
-- distributes them by scope, co-located, so that every row of a scope, its
-- key and its lease, lives on one shard and every statement about a key runs
-- on one worker; and drops what Citus cannot have. A business table shares a
-- phase's transaction on the same worker when it is distributed by a text
-- column holding the same scope value, co-located with idem_keys.
--
-- The migrator sends the statements between "-- idem:step" lines one
-- string at a time: Citus propagates some commands to the workers with the
-- whole query string they came in, and refuses a string of several there.
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';

-- On a worker the acquisition runs with Citus's search_path, where tables
-- named without a schema would not be found: it keeps the migrator's
-- ({{search_path}}, rendered by the migrator: Citus refuses FROM CURRENT
-- on a function it distributes).
ALTER FUNCTION {{schema}}idem_acquire(timestamptz, text, text, text, text, text, bytea, text, bigint, boolean, text,
    text, text, int, text, bigint) SET search_path = {{search_path}};

-- What Citus cannot have: a unique constraint without the distribution
-- column (idem_keys_id serves business tables that reference a key by id on
-- plain PostgreSQL), a foreign key to a table not yet distributed (made
-- again below), and the notify trigger, which would notify on the worker
-- that holds the row, where no store listens (stores poll on Citus).
ALTER TABLE {{schema}}idem_keys DROP CONSTRAINT idem_keys_id;
ALTER TABLE {{schema}}idem_leases DROP CONSTRAINT idem_leases_key_fkey;
ALTER TABLE {{schema}}idem_stragglers DROP CONSTRAINT idem_stragglers_key_fkey;
-- The sweep's cursor (idem_sweep) counts on ids rising in the order keys
-- are inserted: on Citus each worker numbers the keys it inserts from a
-- range of its own, so no cursor over ids holds. The operations find
-- unfinished keys through a partial index instead, which costs each finish
-- an index entry (not a HOT update) on Citus alone.
CREATE INDEX idem_keys_unfinished ON {{schema}}idem_keys (id) WHERE status <> 'finished';
DROP TRIGGER idem_leases_unlocked ON {{schema}}idem_leases;

SELECT create_distributed_table('{{schema}}idem_keys', 'scope');
SELECT create_distributed_table('{{schema}}idem_leases', 'scope', colocate_with => '{{schema}}idem_keys');
SELECT create_distributed_table('{{schema}}idem_stragglers', 'scope', colocate_with => '{{schema}}idem_keys');
-- An operator's verdict is inserted in the transaction of its key's commit:
-- co-located, it lands on the same worker.
SELECT create_distributed_table('{{schema}}idem_verdicts', 'scope', colocate_with => '{{schema}}idem_keys');
-- Distributing copies a table's rows into its shards and leaves the local
-- copy on the coordinator's disk, invisible and never reaped: drop it.
SELECT truncate_local_data_after_distributing_table('{{schema}}idem_leases');
SELECT truncate_local_data_after_distributing_table('{{schema}}idem_stragglers');
SELECT truncate_local_data_after_distributing_table('{{schema}}idem_keys');
SELECT truncate_local_data_after_distributing_table('{{schema}}idem_verdicts');
-- idem:step
ALTER TABLE {{schema}}idem_leases ADD CONSTRAINT idem_leases_key_fkey
    FOREIGN KEY (scope, key_id) REFERENCES {{schema}}idem_keys (scope, id) ON DELETE CASCADE;
-- idem:step
ALTER TABLE {{schema}}idem_stragglers ADD CONSTRAINT idem_stragglers_key_fkey
    FOREIGN KEY (scope, key_id) REFERENCES {{schema}}idem_keys (scope, id) ON DELETE CASCADE;

-- The acquisition, distributed by its scope argument, runs whole on the
-- scope's worker: one round trip from the application (see the top of this
-- file for its search_path).
-- idem:step
SELECT create_distributed_function(
    '{{schema}}idem_acquire(timestamptz, text, text, text, text, text, bytea, text, bigint, boolean, text, text, text, int, text, bigint)',
    'p_scope', colocate_with := '{{schema}}idem_keys');
