package idemtest_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
)

type payment struct {
	Customer string `json:"customer"`
	Amount   int64  `json:"amount"`
}

// A two-phase flow with an idempotent charge (paymentFlow), explored at every crash point.
// In a test, call idemtest.Explore(t, cfg) instead: it logs the summary and
// fails the test with the account of the first failed scenario.
func ExampleExploreContext() {
	ctx := context.Background()
	pool, drop := exampleDatabase(ctx) // a migrated schema with a payments table
	defer drop()

	provider := &idemtest.Provider{} // deduplicates on the downstream key, as Stripe does
	flow := paymentFlow(provider)

	rep, err := idemtest.ExploreContext(ctx, idemtest.Config[payment]{
		Pool:      pool,
		Flow:      flow,
		Input:     payment{Customer: "cus_1", Amount: 20_00},
		Compare:   idemtest.EqualJSON("payment_id", "charge"), // generated afresh by every run
		Providers: []idemtest.FakeProvider{provider},
		Check: func(ctx context.Context, key *idemtype.KeyRecord) error {
			return provider.ExpectOne(key.Key) // one charge per request, whatever happened
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%d scenarios, %d failed\n", len(rep.Scenarios), len(rep.Failed()))
	for _, s := range rep.Scenarios {
		fmt.Println(s.Name)
	}
	// Output:
	// 11 scenarios, 0 failed
	// crash_before_commit@payment_recorded
	// crash_after_commit@payment_recorded
	// lost_commit_ack@payment_recorded
	// serialization_failure@payment_recorded
	// lease_takeover@payment_recorded
	// crash_before_commit@charged
	// crash_after_foreign@charged
	// crash_after_commit@charged
	// lost_commit_ack@charged
	// serialization_failure@charged
	// lease_takeover@charged
}

// paymentFlow records a payment, then charges it through provider and
// responds 201.
func paymentFlow(provider *idemtest.Provider) *idem.Flow[payment] {
	return idem.MustNewFlow("payments.create", []idem.Phase[payment]{
		{
			Name: "payment_recorded",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[payment]) (idem.Result, error) {
				var id int64
				err := tx.QueryRow(ctx, `INSERT INTO payments (key_id, amount) VALUES ($1, $2) RETURNING id`,
					run.Key().ID, run.Input().Amount).Scan(&id)
				return idem.Advance(), errors.Join(err, run.SetCheckpoint("payment_id", id))
			},
		},
		{
			Name: "charged",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[payment]) (idem.Result, error) {
				var charge idemtest.Effect
				err := run.Foreign(ctx, "charge", func(ctx context.Context, downstreamKey string) error {
					var err error
					charge, err = provider.Do(ctx, downstreamKey, run.Key().Key)
					return err
				})
				if err != nil {
					return idem.Result{}, err
				}
				var id int64
				if _, err := run.Checkpoint("payment_id", &id); err != nil {
					return idem.Result{}, err
				}
				return idem.RespondJSON(http.StatusCreated, map[string]any{"payment_id": id, "charge": charge.ID}), nil
			},
		},
	}, nil)
}

// The same exploration with the wire scenarios: DatabaseURL makes the kit
// break each of the request's round trips to Postgres in turn, through a
// fault proxy. (Compiled, not run here: it takes seconds.)
func ExampleConfig_databaseURL() {
	ctx := context.Background()
	schema, err := idemtest.OpenSchema(ctx) // idem's tables migrated, in a schema of its own
	if err != nil {
		panic(err)
	}
	defer schema.Close()
	if _, err := schema.Pool.Exec(ctx, `CREATE TABLE payments (id bigserial PRIMARY KEY, key_id bigint UNIQUE, amount bigint NOT NULL)`); err != nil {
		panic(err)
	}
	provider := &idemtest.Provider{}
	rep, err := idemtest.ExploreContext(ctx, idemtest.Config[payment]{
		Pool:        schema.Pool,
		DatabaseURL: schema.URL, // what Pool connects to, search_path included
		Flow:        paymentFlow(provider),
		Input:       payment{Customer: "cus_1", Amount: 20_00},
		Compare:     idemtest.EqualJSON("payment_id", "charge"),
		Providers:   []idemtest.FakeProvider{provider},
		Check: func(ctx context.Context, key *idemtype.KeyRecord) error {
			return provider.ExpectOne(key.Key)
		},
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(rep.Summary())
	if err := rep.Err(); err != nil {
		fmt.Println(err)
	}
}
