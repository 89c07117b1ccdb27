package docsnippets

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/examples/orders"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/pgstore"
)

// quotas stands for a service's per-tenant counter.
type quotas struct{}

func (quotas) Exceeded(context.Context, string) bool { return false }

var quota quotas

// admission holds docs/operations.md, "Bounded growth": Config.Admit.
func admission(store *pgstore.Store) (*idem.Runner, error) {
	runner, err := idem.NewRunner(store, &idem.Config{
		Admit: func(ctx context.Context, scope, flow string) error {
			if quota.Exceeded(ctx, scope) { // your counter, or a count of the scope's unfinished keys
				return idem.TooManyKeys(30 * time.Second)
			}
			return nil
		},
	})
	return runner, err
}

// PaymentInput is docs/operations.md's card payment input.
type PaymentInput struct {
	CardNumber string `json:"card_number"`
	Amount     int64  `json:"amount"`
}

func last4(number string) string {
	if len(number) <= 4 {
		return number
	}
	return number[len(number)-4:]
}

// storedInput holds docs/operations.md, "Keeping card data out":
// FlowConfig.Store.
func storedInput(phases []idem.Phase[PaymentInput]) *idem.Flow[PaymentInput] {
	charge := idem.MustNewFlow("payments.create", phases, &idem.FlowConfig[PaymentInput]{
		Store: func(in PaymentInput) PaymentInput {
			in.CardNumber = last4(in.CardNumber) // or ""
			return in
		},
		NoRedrive: true, // the phases need the number: only the client's retry may resume
	})
	return charge
}

// sealed holds docs/operations.md, "Sealing what is stored": the keyring.
func sealed(pool *pgxpool.Pool, key202601 []byte) (*pgstore.Store, error) {
	store, err := pgstore.New(pool, &pgstore.Config{Keyring: &idemtype.Keyring{
		Current: "2026-01",
		Keys:    map[string][]byte{"2026-01": key202601}, // 32 bytes each, from your secret manager
	}})
	return store, err
}

// wireScenarios holds docs/testing.md, "Wire scenarios".
func wireScenarios(t *testing.T, pool *pgxpool.Pool, schema, databaseURL string, payments orders.Payments, provider *idemtest.Provider) {
	idemtest.Explore(t, idemtest.Config[orders.Params]{
		Pool:        pool,
		Schema:      schema,
		DatabaseURL: databaseURL, // what pool connects to, search_path included
		Flow:        orders.NewFlow(payments),
		Input:       orders.Params{SKU: "rocket", Quantity: 2},
		Compare:     idemtest.EqualJSON("id", "charge_id"),
		Providers:   []idemtest.FakeProvider{provider},
	})
}
