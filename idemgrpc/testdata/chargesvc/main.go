// Command chargesvc is the server TestRetryPolicyThroughKills runs, kills
// with SIGKILL and restarts: the test service's CreateOrder served by
// idemgrpc with a three-phase flow (an order row; a charge at a card
// network that deduplicates on the downstream idempotency key; the answer).
//
//	chargesvc -db URL -schema NAME -network URL -addr HOST:PORT -instance NAME [-default-wait D]
//
// It prints "listening HOST:PORT" on stdout once it serves, or the reason
// it cannot start on stderr (exit status 1); then "waited DURATION KIND"
// for every call that waited for another attempt of its key in flight
// (idemgrpc.Config.DefaultWait), KIND the outcome it then got.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemgrpc"
	"github.com/go-idem/idem/idemgrpc/internal/testpb"
	"github.com/go-idem/idem/pgstore"
)

type input = idemgrpc.Input[*testpb.CreateOrderRequest]

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "chargesvc:", err)
		os.Exit(1)
	}
}

func run() error {
	dbURL := flag.String("db", "", "Postgres URL")
	schema := flag.String("schema", "", "the schema idem's tables are in")
	network := flag.String("network", "", "the card network's base URL")
	addr := flag.String("addr", "127.0.0.1:0", "where to listen")
	instance := flag.String("instance", "", "pgstore.Config.Instance: the same across restarts")
	defaultWait := flag.Duration("default-wait", 0, "idemgrpc.Config.DefaultWait (0: its default)")
	flag.Parse()
	ctx := context.Background()
	poolConfig, err := pgxpool.ParseConfig(*dbURL)
	if err != nil {
		return err
	}
	// A phase holds its connection during the card network's call.
	poolConfig.MaxConns = 24
	pool, err := pgxpool.NewWithConfig(ctx, poolConfig)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := pgstore.New(pool, &pgstore.Config{Schema: *schema, Instance: *instance})
	if err != nil {
		return err
	}
	defer store.Close()
	client := &http.Client{Timeout: 2 * time.Second}
	flow := idem.MustNewFlow("orders.create", []idem.Phase[input]{
		{Name: "order_created", Do: func(ctx context.Context, tx idem.Tx, a *idem.Attempt[input]) (idem.Result, error) {
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO kill_orders (key_id, ref) VALUES ($1, $2) RETURNING id`, a.Key().ID, a.Input().Message.GetSku()).Scan(&id)
			if err != nil {
				return idem.Result{}, err
			}
			return idem.Advance(), a.SetCheckpoint("order_id", id)
		}},
		{Name: "charged", Do: func(ctx context.Context, tx idem.Tx, a *idem.Attempt[input]) (idem.Result, error) {
			var charge string
			err := a.Foreign(ctx, "charge", func(ctx context.Context, key string) error {
				body, _ := json.Marshal(map[string]string{"ref": a.Input().Message.GetSku()})
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, *network+"/charges", bytes.NewReader(body))
				if err != nil {
					return err
				}
				req.Header.Set("Idempotency-Key", key)
				resp, err := client.Do(req)
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return fmt.Errorf("card network: %s", resp.Status)
				}
				var out struct {
					ID string `json:"id"`
				}
				if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
					return err
				}
				charge = out.ID
				return nil
			})
			if err != nil {
				return idem.Result{}, err
			}
			_, err = tx.Exec(ctx, `UPDATE kill_orders SET charge_id = $1 WHERE key_id = $2`, charge, a.Key().ID)
			return idem.Advance(), err
		}},
		{Name: "responded", Do: func(ctx context.Context, tx idem.Tx, a *idem.Attempt[input]) (idem.Result, error) {
			order := &testpb.Order{Sku: a.Input().Message.GetSku(), Quantity: a.Input().Message.GetQuantity()}
			err := tx.QueryRow(ctx, `SELECT id, charge_id FROM kill_orders WHERE key_id = $1`, a.Key().ID).Scan(&order.OrderId, &order.ChargeId)
			if err != nil {
				return idem.Result{}, err
			}
			return idemgrpc.Respond(order)
		}},
	}, nil)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	runner, err := idem.NewRunner(store, &idem.Config{Flows: []idem.AnyFlow{flow}, Logger: log, Observer: waits{}})
	if err != nil {
		return err
	}
	handler, err := idemgrpc.New(runner, flow, &idemgrpc.Config[*testpb.CreateOrderRequest, *testpb.Order, input]{
		FullMethod:  testpb.Orders_CreateOrder_FullMethodName,
		Scope:       func(context.Context) (string, error) { return "tenant:kill", nil },
		DefaultWait: *defaultWait,
	})
	if err != nil {
		return err
	}
	interceptor, err := idemgrpc.UnaryServerInterceptor(handler)
	if err != nil {
		return err
	}
	listener, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(interceptor))
	testpb.RegisterOrdersServer(srv, testpb.UnimplementedOrdersServer{})
	fmt.Printf("listening %s\n", listener.Addr())
	return srv.Serve(listener)
}

// waits prints how long each call that waited for the attempt in flight
// waited, and what it got: what the test measures DefaultWait by.
type waits struct{}

func (waits) Observe(context.Context, idem.Event) {}

func (waits) StartRequest(ctx context.Context, _, _ string) (context.Context, func(*idem.Outcome, error)) {
	return ctx, func(out *idem.Outcome, _ error) {
		if out != nil && out.Waited > 0 {
			fmt.Printf("waited %s %s\n", out.Waited, out.Kind)
		}
	}
}

func (waits) StartPhase(ctx context.Context, _, _ string, _ int) (context.Context, func(error)) {
	return ctx, func(error) {}
}
