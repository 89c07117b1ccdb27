package idem_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net/http"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/migrations"
	"github.com/go-idem/idem/pgstore"
)

type OrderParams struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

// A two-phase order endpoint: record the order, then charge for it and
// respond. The second call with the same key replays the stored response
// without running anything.
func ExampleRunner_Execute() {
	ctx := context.Background()
	// In an application: pool, _ := pgxpool.New(ctx, os.Getenv("DATABASE_URL")).
	schema, drop, err := pgtest.OpenSchema(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer drop()
	pool := schema.Pool

	m, _ := migrations.New(pool, &migrations.Config{Schema: schema.Name})
	if _, err := m.Up(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, sku text, quantity int)`); err != nil {
		log.Fatal(err)
	}

	flow := idem.MustNewFlow("orders.create", []idem.Phase[OrderParams]{
		{
			Name: "order_created",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[OrderParams]) (idem.Result, error) {
				var id int64
				in := run.Input()
				if err := tx.QueryRow(ctx, `INSERT INTO orders (sku, quantity) VALUES ($1, $2) RETURNING id`, in.SKU, in.Quantity).Scan(&id); err != nil {
					return idem.Result{}, err
				}
				return idem.Advance(), run.SetCheckpoint("order_id", id)
			},
		},
		{
			Name: "charged",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[OrderParams]) (idem.Result, error) {
				var orderID int64
				if _, err := run.Checkpoint("order_id", &orderID); err != nil {
					return idem.Result{}, err
				}
				err := run.Foreign(ctx, "charge", func(ctx context.Context, idempotencyKey string) error {
					// Call the payment provider here, sending idempotencyKey.
					return nil
				})
				if err != nil {
					return idem.Result{}, err
				}
				return idem.RespondJSON(http.StatusCreated, map[string]any{"order_id": orderID}), nil
			},
		},
	}, nil)

	store, err := pgstore.New(pool, &pgstore.Config{Schema: schema.Name})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	runner, err := idem.NewRunner(store, &idem.Config{
		Flows:  []idem.AnyFlow{flow},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}

	req := idem.Request{Scope: "customer:42", Key: "order-7f3a", Params: OrderParams{SKU: "rocket", Quantity: 1}}
	for i := 0; i < 2; i++ {
		out, err := runner.Execute(ctx, flow, req)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(out.Kind, out.Response.Status, string(out.Response.Body))
	}
	// Output:
	// executed 201 {"order_id":1}
	// replayed 201 {"order_id":1}
}
