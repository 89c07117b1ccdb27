ALTER TABLE {{schema}}idem_keys
    ALTER COLUMN key TYPE text,
    ALTER COLUMN flow TYPE text,
    ALTER COLUMN method TYPE text,
    ALTER COLUMN path TYPE text,
    ALTER COLUMN status TYPE text,
    ALTER COLUMN recovery_point TYPE text,
    ADD CONSTRAINT idem_keys_key_check CHECK (char_length(key) BETWEEN 1 AND 255),
    ADD CONSTRAINT idem_keys_flow_check CHECK (char_length(flow) BETWEEN 1 AND 128),
    ADD CONSTRAINT idem_keys_method_check CHECK (char_length(method) <= 16),
    ADD CONSTRAINT idem_keys_path_check CHECK (char_length(path) <= 2048),
    ADD CONSTRAINT idem_keys_status_check CHECK (status IN ('running', 'finished', 'needs_reconcile')),
    ADD CONSTRAINT idem_keys_recovery_point_check CHECK (char_length(recovery_point) <= 64);

DROP DOMAIN {{schema}}idem_key, {{schema}}idem_flow, {{schema}}idem_method,
    {{schema}}idem_path, {{schema}}idem_status, {{schema}}idem_recovery_point;

-- Sessions that ran idem_acquire compile it afresh (see the up migration).
ALTER FUNCTION {{schema}}idem_acquire(timestamptz, text, text, text, text, text, bytea, text, bigint, boolean, text) VOLATILE;
