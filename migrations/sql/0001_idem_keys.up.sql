-- idem_keys holds one row per (scope, key): the request, its progress through
-- the flow's phases, the lease that protects it, and the stored response.
CREATE TABLE {{schema}}idem_keys (
    -- What never changes after the insert.
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- request_id is random and never reused; downstream idempotency keys are
    -- derived from it so they stay unique across databases and environments.
    request_id       uuid        NOT NULL DEFAULT gen_random_uuid(),
    scope            text        NOT NULL CHECK (char_length(scope) BETWEEN 1 AND 255),
    key              text        NOT NULL CHECK (char_length(key) BETWEEN 1 AND 255),
    flow             text        NOT NULL CHECK (char_length(flow) BETWEEN 1 AND 128),
    method           text        NOT NULL CHECK (char_length(method) <= 16),
    path             text        NOT NULL CHECK (char_length(path) <= 2048),
    fingerprint      bytea       NOT NULL,
    params           jsonb       NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),

    -- The outcome, written once by the phase that responds.
    response_status  int,
    response_headers jsonb,
    response_body    bytea,
    finished_at      timestamptz,
    expires_at       timestamptz,

    -- Written by each acquisition.
    attempts         int         NOT NULL DEFAULT 1,
    last_error       text,
    -- fence grows on every acquisition and forced unlock; a phase commits only
    -- if the fence it acquired with is still the row's.
    fence            bigint      NOT NULL DEFAULT 1,
    locked_at        timestamptz,

    -- Written by every phase commit, last in the row: the WAL record of an
    -- update on the same page carries only the changed middle of the row.
    status           text        NOT NULL DEFAULT 'running'
                                 CHECK (status IN ('running', 'finished', 'needs_reconcile')),
    -- foreign_mark names the phase whose not-idempotent foreign call may have
    -- happened without the phase committing; it is cleared by that commit.
    foreign_mark     text,
    last_run_at      timestamptz NOT NULL DEFAULT now(),
    lease_expires_at timestamptz,
    recovery_point   text        NOT NULL DEFAULT 'started' CHECK (char_length(recovery_point) <= 64),
    checkpoint       jsonb       NOT NULL DEFAULT '{}',

    CONSTRAINT idem_keys_scope_key UNIQUE (scope, key),
    CONSTRAINT idem_keys_finished_has_response
        CHECK (status <> 'finished' OR (response_status IS NOT NULL AND expires_at IS NOT NULL))
)
-- Every phase commit updates its key's row. Free room on the page lets
-- those updates be HOT (no index touched), provided they change no indexed
-- column: that is why no index below covers a column a phase commit writes.
WITH (fillfactor = 80);

-- The reaper walks finished rows by expiry; unfinished rows are never reaped.
CREATE INDEX idem_keys_reap ON {{schema}}idem_keys (expires_at) WHERE status = 'finished';

-- The completer and the reconcile runs look only at the (few) unfinished
-- rows. Indexed by id, not by last_run_at, which every phase commit writes.
CREATE INDEX idem_keys_unfinished ON {{schema}}idem_keys (id) WHERE status <> 'finished';
