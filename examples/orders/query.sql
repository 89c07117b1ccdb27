-- name: GetProduct :one
SELECT * FROM products
WHERE tenant_id = $1 AND sku = $2;

-- name: CreateOrder :one
INSERT INTO orders (tenant_id, sku, quantity, amount_cents, idempotency_key_id)
VALUES ($1, $2, $3, $4, $5)
RETURNING *;

-- name: GetOrder :one
SELECT * FROM orders
WHERE tenant_id = $1 AND id = $2;

-- name: MarkOrderCharged :exec
UPDATE orders SET status = 'charged', charge_id = $3
WHERE tenant_id = $1 AND id = $2;

-- name: EnqueueOutbox :exec
INSERT INTO outbox (order_id, topic, payload)
VALUES ($1, $2, $3);

-- name: CountOrdersForKey :one
SELECT count(*) FROM orders
WHERE idempotency_key_id = $1;
