package idemtest_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// bundle is a migrated schema of a test's own with an orders table, and a
// fake payment provider.
type bundle struct {
	pool     *pgxpool.Pool
	schema   string
	url      string // the schema's URL: search_path set to it
	provider *idemtest.Provider
}

func setup(t *testing.T) *bundle {
	t.Helper()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	_, err := schema.Pool.Exec(ctx, `
		CREATE TABLE orders (
			id        bigserial PRIMARY KEY,
			key_id    bigint UNIQUE REFERENCES idem_keys (id) ON DELETE SET NULL,
			item      text NOT NULL,
			status    text NOT NULL DEFAULT 'new',
			charge_id text
		);
		CREATE TABLE audit (id bigserial PRIMARY KEY, key_id bigint NOT NULL, what text NOT NULL)`)
	require.NoError(t, err)
	return &bundle{pool: schema.Pool, schema: schema.Name, url: schema.URL, provider: &idemtest.Provider{}}
}

type orderInput struct {
	Item   string `json:"item"`
	Amount int64  `json:"amount"`
}

// orderFlow is a correct three-phase flow shaped like rocket rides: create
// the order, charge it through an idempotent provider, respond. The charge
// phase locks the order row before its foreign call, so a takeover of it
// has the second worker wait for the first one's lock. charge is the foreign
// call; the broken flows replace it.
func (b *bundle) orderFlow(name string, charge func(ctx context.Context, run *idem.Attempt[orderInput]) (string, error)) *idem.Flow[orderInput] {
	if charge == nil {
		charge = b.chargeThroughWrapper
	}
	return idem.MustNewFlow(name, []idem.Phase[orderInput]{
		{
			Name: "order_created",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[orderInput]) (idem.Result, error) {
				var id int64
				err := tx.QueryRow(ctx, `INSERT INTO orders (key_id, item) VALUES ($1, $2) RETURNING id`, run.Key().ID, run.Input().Item).Scan(&id)
				if err != nil {
					return idem.Result{}, err
				}
				return idem.Advance(), run.SetCheckpoint("order_id", id)
			},
		},
		{
			Name: "charged",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[orderInput]) (idem.Result, error) {
				id, err := orderID(run)
				if err != nil {
					return idem.Result{}, err
				}
				if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'charging' WHERE id = $1`, id); err != nil {
					return idem.Result{}, err
				}
				if run.Input().Amount == 0 {
					return idem.RespondJSON(http.StatusPaymentRequired, map[string]any{"order_id": id, "error": "nothing to charge"}), nil
				}
				chargeID, err := charge(ctx, run)
				if err != nil {
					return idem.Result{}, err
				}
				if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'charged', charge_id = $2 WHERE id = $1`, id, chargeID); err != nil {
					return idem.Result{}, err
				}
				return idem.Advance(), run.SetCheckpoint("charge_id", chargeID)
			},
		},
		{
			Name: "responded",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[orderInput]) (idem.Result, error) {
				id, err := orderID(run)
				if err != nil {
					return idem.Result{}, err
				}
				var chargeID string
				if _, err := run.Checkpoint("charge_id", &chargeID); err != nil {
					return idem.Result{}, err
				}
				return idem.RespondJSON(http.StatusCreated, map[string]any{"order_id": id, "charge_id": chargeID, "item": run.Input().Item}), nil
			},
		},
	}, nil)
}

func orderID(run *idem.Attempt[orderInput]) (int64, error) {
	var id int64
	ok, err := run.Checkpoint("order_id", &id)
	if err == nil && !ok {
		err = errors.New("no order_id checkpoint")
	}
	return id, err
}

// chargeThroughWrapper is the right way: one call through Attempt.Foreign,
// sending the downstream key it is given.
func (b *bundle) chargeThroughWrapper(ctx context.Context, run *idem.Attempt[orderInput]) (string, error) {
	var chargeID string
	err := run.Foreign(ctx, "charge", func(ctx context.Context, key string) error {
		e, err := b.provider.Do(ctx, key, run.Key().Key)
		chargeID = e.ID
		return err
	})
	return chargeID, err
}

// config is the kit config for flow on the bundle's database: the checks a
// careful user would write.
func (b *bundle) config(flow *idem.Flow[orderInput]) idemtest.Config[orderInput] {
	return idemtest.Config[orderInput]{
		Pool:    b.pool,
		Schema:  b.schema,
		Flow:    flow,
		Input:   orderInput{Item: "book", Amount: 12_00},
		Compare: idemtest.EqualJSON("order_id", "charge_id"),
		Check:   b.oneChargedOrder,
	}
}

// oneChargedOrder is a business invariant: exactly one order row for the
// key, charged, and exactly one charge at the provider.
func (b *bundle) oneChargedOrder(ctx context.Context, key *idemtype.KeyRecord) error {
	var n int
	var status string
	if err := b.pool.QueryRow(ctx, `SELECT count(*), min(status) FROM orders WHERE key_id = $1`, key.ID).Scan(&n, &status); err != nil {
		return err
	}
	if n != 1 || status != "charged" {
		return fmt.Errorf("%d order rows with status %q for the key, want one charged", n, status)
	}
	return b.provider.ExpectOne(key.Key)
}

// failedNames lists a report's failed scenarios by name.
func failedNames(rep *idemtest.Report) []string {
	var names []string
	for _, s := range rep.Failed() {
		names = append(names, s.Name)
	}
	return names
}

func scenarioNamed(t *testing.T, rep *idemtest.Report, name string) *idemtest.Scenario {
	t.Helper()
	for _, s := range rep.Scenarios {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no scenario %q in %v", name, rep.Scenarios)
	return nil
}

// exampleDatabase is a migrated schema with the example's payments table,
// for ExampleRun, which has no testing.TB.
func exampleDatabase(ctx context.Context) (*pgxpool.Pool, func()) {
	schema, drop, err := pgtest.OpenMigratedSchema(ctx)
	if err != nil {
		panic(err)
	}
	if _, err := schema.Pool.Exec(ctx, `CREATE TABLE payments (id bigserial PRIMARY KEY, key_id bigint UNIQUE, amount bigint NOT NULL)`); err != nil {
		_ = drop()
		panic(err)
	}
	return schema.Pool, func() { _ = drop() }
}
