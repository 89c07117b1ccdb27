-- The rides service's own tables, after rocket-rides-atomic's schema.sql.
-- Applied on every start after idem's migrations (rides references
-- idem_keys), in one transaction under an advisory lock; every statement is
-- idempotent. Table names are unqualified: they go where the connection's
-- search_path says.

-- users: who may call the API. customer_id is the rider's customer at the
-- payment provider.
CREATE TABLE IF NOT EXISTS users (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email       text   NOT NULL UNIQUE,
    customer_id text   NOT NULL UNIQUE
);

INSERT INTO users (email, customer_id) VALUES
    ('user@example.com', 'cus_123'),
    ('user-bad-source@example.com', 'cus_bad_source')
ON CONFLICT (email) DO NOTHING;

-- rides: one per accepted booking. idempotency_key_id lets a resumed
-- request find the ride its first attempt created; keys are reaped after
-- their retention, so the reference is cleared, never cascaded.
CREATE TABLE IF NOT EXISTS rides (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at         timestamptz NOT NULL DEFAULT now(),
    idempotency_key_id bigint UNIQUE REFERENCES idem_keys (id) ON DELETE SET NULL,
    user_id            bigint NOT NULL REFERENCES users (id),
    origin_lat         double precision NOT NULL,
    origin_lon         double precision NOT NULL,
    target_lat         double precision NOT NULL,
    target_lon         double precision NOT NULL,
    payment_status     text NOT NULL DEFAULT 'pending' CHECK (payment_status IN ('pending', 'charged', 'declined')),
    charge_id          text UNIQUE,
    CONSTRAINT rides_charged_has_charge CHECK ((payment_status = 'charged') = (charge_id IS NOT NULL))
);

-- receipts: one per charged ride, written in the phase that answers.
CREATE TABLE IF NOT EXISTS receipts (
    ride_id   bigint PRIMARY KEY REFERENCES rides (id) ON DELETE CASCADE,
    email     text   NOT NULL,
    charge_id text   NOT NULL,
    amount    bigint NOT NULL
);
