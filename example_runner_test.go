package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/migrations"
	"github.com/go-idem/idem/pgstore"
)

// The README's quick start, declared and wired exactly as it prints them.

type OrderParams struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

var createOrder = idem.MustNewFlow("orders.create", []idem.Phase[OrderParams]{
	{Name: "order_created", Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[OrderParams]) (idem.Result, error) {
		var id int64
		err := tx.QueryRow(ctx, `INSERT INTO orders (sku, quantity) VALUES ($1, $2) RETURNING id`,
			run.Input().SKU, run.Input().Quantity).Scan(&id)
		if err != nil {
			return idem.Result{}, err
		}
		return idem.Advance(), run.SetCheckpoint("order_id", id)
	}},
	{Name: "charged", Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[OrderParams]) (idem.Result, error) {
		var orderID int64
		_, err := run.Checkpoint("order_id", &orderID) // order_created set it
		if err != nil {
			return idem.Result{}, err
		}
		err = run.Foreign(ctx, "charge", func(ctx context.Context, key string) error {
			return payments.Charge(ctx, key, orderID) // the provider deduplicates on key
		})
		if err != nil {
			return idem.Result{}, err
		}
		return idem.RespondJSON(http.StatusCreated, map[string]any{"order_id": orderID}), nil
	}},
}, nil)

// payments stands for a payment provider's client.
var payments paymentsClient

type paymentsClient struct{}

func (paymentsClient) Charge(ctx context.Context, idempotencyKey string, orderID int64) error {
	return nil
}

// userFromAuth stands for an application's authentication: the key
// belongs to the caller.
func userFromAuth(r *http.Request) (string, error) {
	user := r.Header.Get("X-User")
	if user == "" {
		return "", idemhttp.ErrUnauthenticated
	}
	return "user:" + user, nil
}

// The quick start: a two-phase order endpoint over HTTP. The retry with the
// same Idempotency-Key gets the stored response, byte for byte, and runs
// nothing.
func Example() {
	ctx := context.Background()
	// A migrated throwaway schema; in an application:
	// pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")).
	schema, err := idemtest.OpenSchema(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer schema.Close()
	pool := schema.Pool
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, sku text, quantity int)`); err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()

	m, err := migrations.New(pool, nil) // idem's table, in the pool's schema
	if err != nil {
		log.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		log.Fatal(err)
	}
	store, err := pgstore.New(pool, &pgstore.Config{
		// A name this process alone keeps across restarts (a StatefulSet pod's
		// name, set as IDEM_INSTANCE): after a crash its restart takes its own
		// keys over at once, instead of answering 409 until their 90 s leases
		// run out. Never the same name for two live processes (several workers
		// on one host, a reload that overlaps): leave it empty if unsure.
		Instance: os.Getenv("IDEM_INSTANCE"),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	runner, err := idem.NewRunner(store, &idem.Config{Flows: []idem.AnyFlow{createOrder}})
	if err != nil {
		log.Fatal(err)
	}
	// The reaper, the completer (it finishes requests whose clients gave up)
	// and reconcile runs, in the background (Config.Maintenance tunes them).
	// Stop waits for them; deferred after store.Close, it runs first.
	if err := runner.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer runner.Stop(context.Background())
	handler, err := idemhttp.New(runner, createOrder, &idemhttp.Config[OrderParams]{Scope: userFromAuth})
	if err != nil {
		log.Fatal(err)
	}
	mux.Handle("POST /orders", handler)

	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"sku": "rocket", "quantity": 1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "order-7f3a")
		req.Header.Set("X-User", "42")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), w.Body.String())
	}
	// Output:
	// 201  {"order_id":1}
	// 201 true {"order_id":1}
}

// The same flow without HTTP. The second call with the same key replays the
// stored response without running anything.
func ExampleRunner_Execute() {
	ctx := context.Background()
	schema, err := idemtest.OpenSchema(ctx) // a migrated throwaway schema
	if err != nil {
		log.Fatal(err)
	}
	defer schema.Close()
	if _, err := schema.Pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, sku text, quantity int)`); err != nil {
		log.Fatal(err)
	}
	store, err := pgstore.New(schema.Pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	runner, err := idem.NewRunner(store, &idem.Config{
		Flows:  []idem.AnyFlow{createOrder},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}

	req := idem.Request{Scope: "customer:42", Key: "order-7f3a", Params: OrderParams{SKU: "rocket", Quantity: 1}}
	for range 2 {
		out, err := runner.Execute(ctx, createOrder, req)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(out.Kind, out.Response.Status, string(out.Response.Body))
	}
	// Output:
	// executed 201 {"order_id":1}
	// replayed 201 {"order_id":1}
}

// idem.Execute takes the flow's input typed: an input of another type does
// not compile, where Request.Params would fail at run time.
func ExampleExecute() {
	ctx := context.Background()
	schema, err := idemtest.OpenSchema(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer schema.Close()
	if _, err := schema.Pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, sku text, quantity int)`); err != nil {
		log.Fatal(err)
	}
	store, err := pgstore.New(schema.Pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	runner, err := idem.NewRunner(store, &idem.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}

	out, err := idem.Execute(ctx, runner, createOrder, idem.Request{Scope: "customer:42", Key: "order-1"}, OrderParams{SKU: "rocket", Quantity: 2})
	fmt.Println(out.Kind, err)
	_, err = idem.Execute(ctx, runner, createOrder, idem.Request{Scope: "customer:42", Key: "order-2", Params: OrderParams{}}, OrderParams{})
	fmt.Println(errors.Is(err, idem.ErrInvalidParams))
	// Output:
	// executed <nil>
	// true
}
