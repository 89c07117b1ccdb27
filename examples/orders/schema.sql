-- The orders service's own tables, applied after idem's migrations (which
-- create idem_keys; `idem migrate sql --format goose` prints them for goose).
-- sqlc reads this file to type the queries in query.sql; it needs no
-- declaration of idem_keys for the foreign key below.

CREATE TABLE products (
    tenant_id   text   NOT NULL,
    sku         text   NOT NULL,
    price_cents bigint NOT NULL CHECK (price_cents >= 0),
    PRIMARY KEY (tenant_id, sku)
);

CREATE TABLE orders (
    id                 bigserial PRIMARY KEY,
    tenant_id          text      NOT NULL,
    sku                text      NOT NULL,
    quantity           integer   NOT NULL CHECK (quantity > 0),
    amount_cents       bigint    NOT NULL,
    status             text      NOT NULL DEFAULT 'new',
    charge_id          text,
    -- The key that created the order. Nullable, so that the reaper deleting
    -- an expired key leaves the order in place (ON DELETE SET NULL); sqlc
    -- types it pgtype.Int8. Unique, so a phase that somehow ran twice for
    -- one key could not create two orders. Indexed by that constraint,
    -- which the reaper's deletes need.
    idempotency_key_id bigint    UNIQUE REFERENCES idem_keys (id) ON DELETE SET NULL,
    created_at         timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE outbox (
    id       bigserial PRIMARY KEY,
    order_id bigint NOT NULL REFERENCES orders (id),
    topic    text   NOT NULL,
    payload  jsonb  NOT NULL
);
