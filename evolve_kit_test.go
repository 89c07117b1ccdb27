package idem_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
)

// upgradeOrder is an order flow of three phases, each committing alone: the
// order row, the charge (named charge, with its former names) and the
// receipt, which responds.
func upgradeOrder(payments *idemtest.Provider, charge string, former ...string) *idem.Flow[rideInput] {
	return idem.MustNewFlow("orders.upgrade", upgradeOrderPhases(payments, charge, former...), nil)
}

func upgradeOrderPhases(payments *idemtest.Provider, charge string, former ...string) []idem.Phase[rideInput] {
	return []idem.Phase[rideInput]{
		{
			Name: "order_created",
			Do: func(ctx context.Context, tx idem.Tx, a *idem.Attempt[rideInput]) (idem.Result, error) {
				var id int64
				if err := tx.QueryRow(ctx, `INSERT INTO orders (origin) VALUES ($1) RETURNING id`, a.Input().Origin).Scan(&id); err != nil {
					return idem.Result{}, err
				}
				return idem.Advance(), a.SetCheckpoint("order_id", id)
			},
		},
		{
			Name:        charge,
			FormerNames: former,
			Do: func(ctx context.Context, tx idem.Tx, a *idem.Attempt[rideInput]) (idem.Result, error) {
				var orderID int64
				if _, err := a.Checkpoint("order_id", &orderID); err != nil {
					return idem.Result{}, err
				}
				var effect idemtest.Effect
				if err := a.Foreign(ctx, "charge", func(ctx context.Context, key string) (err error) {
					effect, err = payments.Do(ctx, key, fmt.Sprint("order:", orderID))
					return err
				}); err != nil {
					return idem.Result{}, err
				}
				_, err := tx.Exec(ctx, `UPDATE orders SET charge_id = $1 WHERE id = $2`, effect.ID, orderID)
				return idem.Advance(), err
			},
		},
		{
			Name: "receipt_enqueued",
			Do: func(ctx context.Context, tx idem.Tx, a *idem.Attempt[rideInput]) (idem.Result, error) {
				var orderID int64
				if _, err := a.Checkpoint("order_id", &orderID); err != nil {
					return idem.Result{}, err
				}
				if _, err := tx.Exec(ctx, `INSERT INTO receipts (order_id) VALUES ($1)`, orderID); err != nil {
					return idem.Result{}, err
				}
				return idem.RespondJSON(http.StatusCreated, map[string]any{"status": "charged"}), nil
			},
		},
	}
}

// exploreUpgrade runs the crash kit over next with prev as the previous
// definition; every scenario's key must end with one order, charged once,
// and one receipt.
func exploreUpgrade(t *testing.T, payments *idemtest.Provider, prev, next *idem.Flow[rideInput]) (*idemtest.Report, error) {
	t.Helper()
	return exploreUpgradeChecking(t, payments, prev, next, true)
}

// exploreUpgradeChecking is exploreUpgrade; without expectOne the Check
// leaves double charges to the kit's own checks.
func exploreUpgradeChecking(t *testing.T, payments *idemtest.Provider, prev, next *idem.Flow[rideInput], expectOne bool) (*idemtest.Report, error) {
	t.Helper()
	schema := idemtest.NewSchema(t)
	joinedOrderTables(t, schema.Pool)
	return idemtest.ExploreContext(context.Background(), idemtest.Config[rideInput]{
		Pool:         schema.Pool,
		Flow:         next,
		PreviousFlow: prev,
		Input:        rideInput{Origin: "home"},
		Providers:    []idemtest.FakeProvider{payments},
		Check: func(ctx context.Context, key *idemtype.KeyRecord) error {
			var orderID int64
			if err := json.Unmarshal(key.Checkpoint["order_id"], &orderID); err != nil {
				return fmt.Errorf("order_id checkpoint: %w", err)
			}
			var charged, receipts int
			if err := schema.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE o.charge_id IS NOT NULL), count(r.id)
				FROM orders o LEFT JOIN receipts r ON r.order_id = o.id WHERE o.id = $1`, orderID).Scan(&charged, &receipts); err != nil {
				return err
			}
			if charged != 1 || receipts != 1 {
				return fmt.Errorf("order %d: charged %d, receipts %d; want 1 and 1", orderID, charged, receipts)
			}
			if !expectOne {
				return nil
			}
			return payments.ExpectOne(fmt.Sprint("order:", orderID))
		},
	})
}

// The crash kit checks a flow change before it ships: a declared rename
// passes every upgrade scenario (the previous definition dies at each crash
// point, the new one finishes the key, the charge made once), and the same
// rename undeclared fails the check and the scenarios.
func TestCrashKitChecksAFlowChange(t *testing.T) {
	t.Parallel()
	t.Run("declared", func(t *testing.T) {
		t.Parallel()
		payments := &idemtest.Provider{}
		rep, err := exploreUpgrade(t, payments, upgradeOrder(payments, "order_charged"), upgradeOrder(payments, "card_charged", "order_charged"))
		require.NoError(t, err)
		require.NoError(t, rep.Err())
		var upgrades []string
		for _, sc := range rep.Scenarios {
			if sc.Name == "flow change" || len(sc.Name) > 8 && sc.Name[:8] == "upgrade:" {
				upgrades = append(upgrades, sc.Name)
			}
		}
		t.Logf("%s; upgrade scenarios: %v", rep.Summary(), upgrades)
		require.Contains(t, upgrades, "flow change")
		require.Contains(t, upgrades, "upgrade:"+string(idemtest.CrashAfterForeign)+"@order_charged")
		require.Len(t, upgrades, 1+2+3+2, "the check, two crash kinds at each plain phase, three at the charge")
	})
	t.Run("undeclared", func(t *testing.T) {
		t.Parallel()
		payments := &idemtest.Provider{}
		rep, err := exploreUpgrade(t, payments, upgradeOrder(payments, "order_charged"), upgradeOrder(payments, "card_charged"))
		require.NoError(t, err)
		err = rep.Err()
		require.Error(t, err)
		require.ErrorContains(t, err, "flow change")
		var failed []string
		for _, sc := range rep.Failed() {
			failed = append(failed, sc.Name)
		}
		t.Logf("failed: %v", failed)
		require.Contains(t, failed, "flow change")
		require.Contains(t, failed, "upgrade:"+string(idemtest.CrashAfterForeign)+"@order_charged", "the retry sent a new downstream key")
	})
	// A rename declared as a removal and a new phase is no rename: the new
	// phase's call gets new downstream keys. CheckFlowChange cannot see
	// that (it does not know what a phase calls); the upgrade scenarios
	// see the call go out twice, with no help from Check.
	t.Run("retired and replaced", func(t *testing.T) {
		t.Parallel()
		payments := &idemtest.Provider{}
		next := idem.MustNewFlow("orders.upgrade", upgradeOrderPhases(payments, "card_charged"),
			&idem.FlowConfig[rideInput]{RetiredPhases: map[string]string{"order_charged": "order_created"}})
		rep, err := exploreUpgradeChecking(t, payments, upgradeOrder(payments, "order_charged"), next, false)
		require.NoError(t, err)
		require.ErrorContains(t, rep.Err(), "went out with 2 different downstream keys across the upgrade")
		var failed []string
		for _, sc := range rep.Failed() {
			failed = append(failed, sc.Name)
		}
		t.Logf("failed: %v", failed)
		require.Contains(t, failed, "upgrade:"+string(idemtest.CrashAfterForeign)+"@order_charged")
		require.NotContains(t, failed, "flow change")
	})
}
