-- The rides service's own tables, after rocket-rides-atomic's schema.sql.
-- {{schema}} is replaced by the configured schema prefix (empty, or "name.").
-- Every statement is idempotent: Migrate applies this file on every start,
-- under an advisory lock, after idem's migrations (rides references idem_keys).

-- users: who may call the API. customer_id is the user's customer at the
-- payment provider (fakepay), charged for every ride.
CREATE TABLE IF NOT EXISTS {{schema}}users (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email       text        NOT NULL UNIQUE CHECK (char_length(email) <= 255),
    customer_id text        NOT NULL UNIQUE CHECK (char_length(customer_id) <= 255),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- rides: one per accepted request. idempotency_key_id lets a resumed request
-- find the ride its first attempt created. Keys are reaped after their
-- retention, so the reference is cleared, never cascaded: the ride outlives
-- its key.
CREATE TABLE IF NOT EXISTS {{schema}}rides (
    id                 bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at         timestamptz NOT NULL DEFAULT now(),
    idempotency_key_id bigint      UNIQUE REFERENCES {{schema}}idem_keys (id) ON DELETE SET NULL,
    user_id            bigint      NOT NULL REFERENCES {{schema}}users (id) ON DELETE RESTRICT,
    origin_lat         double precision NOT NULL CHECK (origin_lat BETWEEN -90 AND 90),
    origin_lon         double precision NOT NULL CHECK (origin_lon BETWEEN -180 AND 180),
    target_lat         double precision NOT NULL CHECK (target_lat BETWEEN -90 AND 90),
    target_lon         double precision NOT NULL CHECK (target_lon BETWEEN -180 AND 180),
    -- payment_status is pending until the charge phase commits, then charged
    -- (charge_id set), declined (the card was refused; a stored 402) or
    -- failed (the provider rejected the request outright; a stored 502).
    payment_status     text        NOT NULL DEFAULT 'pending'
                                   CHECK (payment_status IN ('pending', 'charged', 'declined', 'failed')),
    charge_id          text        UNIQUE CHECK (char_length(charge_id) <= 255),
    -- charge_reference names the ride's charge at the provider (its
    -- description). It is the request's downstream idempotency key, derived
    -- from the request rather than from the ride's id, so the retry of a
    -- request whose ride a failover lost sends the very same charge and the
    -- provider, which compares the parameters sent under a key, returns the
    -- first charge instead of refusing. NULL on rides from before it existed.
    charge_reference   text        CHECK (char_length(charge_reference) <= 255),
    CONSTRAINT rides_charged_has_charge CHECK ((payment_status = 'charged') = (charge_id IS NOT NULL))
);
ALTER TABLE {{schema}}rides ADD COLUMN IF NOT EXISTS charge_reference text CHECK (char_length(charge_reference) <= 255);
CREATE INDEX IF NOT EXISTS rides_charge_reference ON {{schema}}rides (charge_reference);

-- audit_records: what happened, written in the same transaction as the
-- change it describes. origin_ip is the client's address; it is NULL when
-- the request was driven to completion server-side, without a client.
CREATE TABLE IF NOT EXISTS {{schema}}audit_records (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at    timestamptz NOT NULL DEFAULT now(),
    action        text        NOT NULL CHECK (char_length(action) <= 50),
    data          jsonb       NOT NULL,
    origin_ip     inet,
    resource_id   bigint      NOT NULL,
    resource_type text        NOT NULL CHECK (char_length(resource_type) <= 50),
    user_id       bigint      NOT NULL REFERENCES {{schema}}users (id) ON DELETE RESTRICT
);

-- receipts: one per charged ride, written by the receipt job. The unique
-- ride_id is what makes the job safe to run more than once: the queue
-- retries jobs, and a retried job finds its receipt already there.
CREATE TABLE IF NOT EXISTS {{schema}}receipts (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ride_id    bigint      NOT NULL UNIQUE REFERENCES {{schema}}rides (id) ON DELETE CASCADE,
    user_id    bigint      NOT NULL REFERENCES {{schema}}users (id) ON DELETE RESTRICT,
    email      text        NOT NULL,
    charge_id  text        NOT NULL,
    amount     bigint      NOT NULL,
    currency   text        NOT NULL,
    sent_at    timestamptz NOT NULL DEFAULT now()
);
