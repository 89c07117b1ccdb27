// Command svc is the service the upgrade test runs as two builds, the
// previous release's and this tree's, against one database. It must compile
// against both, so it uses only API that v0.1.0 has: a two-phase flow (an
// order row, then a charge at a provider that deduplicates on the
// idempotency key) behind idemhttp.
//
//	svc -db URL -provider URL [-migrate] [-lease 4s] [-retention 24h] [-complete-once]
//
// It prints "listening http://ADDR" on stdout once it serves, or the reason it
// cannot start on stderr (exit status 1). With -complete-once it serves
// nothing: it runs one completer pass over idle keys (the Maintainer's
// completer, as an instance of that build runs it), prints "completed
// claimed=N completed=M" and exits.
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

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
	"github.com/go-idem/idem/migrations"
	"github.com/go-idem/idem/pgstore"
)

// Order is the flow's input: the reference the provider counts charges by.
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
	provider := flag.String("provider", "", "the payment provider's base URL")
	migrate := flag.Bool("migrate", false, "apply idem's migrations at start, as a release that migrates on start does")
	lease := flag.Duration("lease", 4*time.Second, "idem's lease")
	retention := flag.Duration("retention", 0, "how long a finished key is kept (0: idem's default)")
	completeOnce := flag.Bool("complete-once", false, "run one completer pass over idle keys and exit")
	flag.Parse()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := migrations.New(pool, nil)
	if err != nil {
		return err
	}
	if *migrate {
		if _, err := m.Up(ctx); err != nil {
			return fmt.Errorf("migrate on start: %w", err)
		}
	}
	store, err := pgstore.New(pool, nil)
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
			return idem.RespondJSON(http.StatusCreated, map[string]any{"order_id": orderID, "charge": charge}), nil
		}},
	}, nil)
	runner, err := idem.NewRunner(store, &idem.Config{
		Flows:     []idem.AnyFlow{flow},
		Lease:     *lease,
		Retention: *retention,
		Logger:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	if *completeOnce {
		res, err := runner.Complete(ctx, &idem.CompleteConfig{IdleFor: time.Millisecond})
		if err != nil {
			return err
		}
		fmt.Printf("completed claimed=%d completed=%d\n", res.Claimed, res.Completed)
		return nil
	}
	handler, err := idemhttp.New(runner, flow, &idemhttp.Config[Order]{
		Scope: func(*http.Request) (string, error) { return "upgrade", nil },
	})
	if err != nil {
		return err
	}
	version, err := m.Version(ctx)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", handler)
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Printf("listening http://%s schema=%d knows=%d\n", listener.Addr(), version, migrations.Latest())
	server := &http.Server{Handler: mux, ReadHeaderTimeout: time.Minute}
	return server.Serve(listener)
}
