package docsnippets

import (
	"context"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/examples/orders"
	"github.com/go-idem/idem/examples/orders/db"
	"github.com/go-idem/idem/idemdriver"
)

// The snippets of docs/pgx-sqlc.md that are not examples/orders' own code.

type service struct {
	queries *db.Queries // db.New(pool), made once at startup
}

// Wrong: it compiles and passes the happy path, but the insert commits on
// its own, outside the phase's transaction.
func (s *service) createOrderWrong(ctx context.Context, tx idem.Tx, run *idem.Attempt[orders.Params]) (idem.Result, error) {
	order, err := s.queries.CreateOrder(ctx, orderParams(run)) // the pool's connection, not tx
	if err != nil {
		return idem.Result{}, err
	}
	return idem.Advance(), run.SetCheckpoint("order_id", order.ID)
}

// Right: queries on the phase's transaction.
func (s *service) createOrder(ctx context.Context, tx idem.Tx, run *idem.Attempt[orders.Params]) (idem.Result, error) {
	order, err := db.New(tx).CreateOrder(ctx, orderParams(run))
	if err != nil {
		return idem.Result{}, err
	}
	return idem.Advance(), run.SetCheckpoint("order_id", order.ID)
}

// Also right: the service's *db.Queries, moved onto the phase's
// transaction. WithTx takes a pgx.Tx; run.PgxTx() is the phase's, whose
// Commit and Rollback refuse.
func (s *service) createOrderWithTx(ctx context.Context, tx idem.Tx, run *idem.Attempt[orders.Params]) (idem.Result, error) {
	order, err := s.queries.WithTx(run.PgxTx()).CreateOrder(ctx, orderParams(run))
	if err != nil {
		return idem.Result{}, err
	}
	return idem.Advance(), run.SetCheckpoint("order_id", order.ID)
}

func orderParams(run *idem.Attempt[orders.Params]) db.CreateOrderParams {
	return db.CreateOrderParams{
		TenantID: "acme", Sku: run.Input().SKU, Quantity: run.Input().Quantity,
		IdempotencyKeyID: pgtype.Int8{Int64: run.Key().ID, Valid: true},
	}
}

// timeouts holds docs/pgx-sqlc.md, "Timeouts".
func timeouts(store idemdriver.Store) (*idem.Runner, error) {
	runner, err := idem.NewRunner(store, &idem.Config{
		StatementTimeout:      2 * time.Second,  // the runner's own round trips: acquire, commit, heartbeat
		PhaseStatementTimeout: 10 * time.Second, // each statement a phase sends through its tx
	})
	return runner, err
}

// providerTimeout holds docs/pgx-sqlc.md, "Timeouts": a foreign call bounds
// itself.
func providerTimeout(ctx context.Context, run *idem.Attempt[orders.Params], client *http.Client, charge func(context.Context, *http.Client, string) (string, error)) (string, error) {
	var chargeID string
	err := run.Foreign(ctx, "charge", func(ctx context.Context, key string) error {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second) // the request's deadline does not reach here
		defer cancel()
		var err error
		chargeID, err = charge(ctx, client, key)
		return err
	})
	return chargeID, err
}
