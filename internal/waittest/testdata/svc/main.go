// Command svc is the service the waiting tests run as two processes on one
// database: a two-phase flow (an order row, then a charge at a provider
// that deduplicates on the idempotency key, and that the test holds) behind
// idemhttp with MaxWait set.
//
//	svc -db URL -provider URL [-lease 3s] [-max-wait 30s] [-polling]
//
// It prints "listening http://ADDR" on stdout once it serves, or the reason it
// cannot start on stderr (exit status 1). GET /stats answers the runner's
// counts as JSON: in_progress (requests that found the key held, once
// each), in_progress_events (every time one did), notifications (wake-ups
// its store's listener received).
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
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
	"github.com/go-idem/idem/internal/hooks"
	"github.com/go-idem/idem/pgstore"
)

// seenKey keys a request's flag: it found the key in progress.
type seenKey struct{}

// Order is the flow's input.
type Order struct {
	Ref string `json:"ref"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "svc:", err)
		os.Exit(1)
	}
}

func run() error {
	dbURL := flag.String("db", "", "Postgres URL (its search_path names the schema)")
	schema := flag.String("schema", "", "the schema idem's tables are in")
	provider := flag.String("provider", "", "the payment provider's base URL")
	lease := flag.Duration("lease", 3*time.Second, "idem's lease")
	maxWait := flag.Duration("max-wait", 30*time.Second, "idemhttp.Config.MaxWait")
	polling := flag.Bool("polling", false, "pgstore.WaitPoll")
	flag.Parse()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	wait := pgstore.WaitAuto
	if *polling {
		wait = pgstore.WaitPoll
	}
	store, err := pgstore.New(pool, &pgstore.Config{Schema: *schema, Wait: wait})
	if err != nil {
		return err
	}
	defer store.Close()
	client := &http.Client{Timeout: 2 * time.Minute}
	flow := idem.MustNewFlow("orders.create", []idem.Phase[Order]{
		{Name: "order_created", Do: func(ctx context.Context, tx idem.Tx, a *idem.Attempt[Order]) (idem.Result, error) {
			var id int64
			if err := tx.QueryRow(ctx, `INSERT INTO svc_orders (ref) VALUES ($1) RETURNING id`, a.Input().Ref).Scan(&id); err != nil {
				return idem.Result{}, err
			}
			return idem.Advance(), a.SetCheckpoint("order_id", id)
		}},
		{Name: "charged", Do: func(ctx context.Context, tx idem.Tx, a *idem.Attempt[Order]) (idem.Result, error) {
			var orderID int64
			_, err := a.Checkpoint("order_id", &orderID)
			if err != nil {
				return idem.Result{}, err
			}
			var charge string
			err = a.Foreign(ctx, "charge", func(ctx context.Context, key string) error {
				body, _ := json.Marshal(map[string]string{"ref": a.Input().Ref})
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, *provider+"/charges", bytes.NewReader(body))
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
					return fmt.Errorf("provider: %s", resp.Status)
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
			return idem.RespondJSON(http.StatusCreated, map[string]any{
				"order_id": orderID, "charge": charge, "pid": os.Getpid(), "at": time.Now().UnixNano()}), nil
		}},
	}, nil)
	// inProgress counts the requests that found the key held (once each,
	// however often a waiter finds it so); events the events.
	var inProgress, events atomic.Int64
	runner, err := idem.NewRunner(store, &idem.Config{
		Flows: []idem.AnyFlow{flow},
		Lease: *lease,
		Observer: idem.ObserverFunc(func(ctx context.Context, e idem.Event) {
			if e.Kind == idem.EventInProgress {
				events.Add(1)
				if seen, ok := ctx.Value(seenKey{}).(*atomic.Bool); ok && seen.CompareAndSwap(false, true) {
					inProgress.Add(1)
				}
			}
		}),
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	handler, err := idemhttp.New(runner, flow, &idemhttp.Config[Order]{
		Scope:   func(*http.Request) (string, error) { return "waiters", nil },
		MaxWait: *maxWait,
	})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handler.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), seenKey{}, new(atomic.Bool))))
	}))
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"in_progress": inProgress.Load(), "in_progress_events": events.Load(),
			"notifications": hooks.StoreWaits(store).Notifications, "listening": hooks.StoreWaits(store).Listening, "polling": hooks.StoreWaits(store).Polling})
	})
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Printf("listening http://%s\n", listener.Addr())
	server := &http.Server{Handler: mux, ReadHeaderTimeout: time.Minute}
	return server.Serve(listener)
}
