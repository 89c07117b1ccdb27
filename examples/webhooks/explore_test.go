package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/pgtest"
)

// bookedOnce is the receiver's invariant for one key: one event row, one
// ledger entry, and the stored response names that entry.
func bookedOnce(schema *pgtest.Schema) func(ctx context.Context, key *idemtype.KeyRecord) error {
	return func(ctx context.Context, key *idemtype.KeyRecord) error {
		var events, entries int
		var entry *int64
		err := schema.Pool.QueryRow(ctx, `SELECT
				(SELECT count(*) FROM `+schema.Name+`.webhook_events WHERE idempotency_key_id = $1),
				(SELECT count(*) FROM `+schema.Name+`.ledger WHERE idempotency_key_id = $1),
				(SELECT min(id) FROM `+schema.Name+`.ledger WHERE idempotency_key_id = $1)`, key.ID).Scan(&events, &entries, &entry)
		if err != nil {
			return err
		}
		if events != 1 || entries != 1 {
			return fmt.Errorf("key %d has %d event rows and %d ledger entries, want one of each", key.ID, events, entries)
		}
		var resp Response
		if err := json.Unmarshal(key.ResponseBody, &resp); err != nil {
			return fmt.Errorf("the stored response: %w", err)
		}
		if resp.LedgerEntry == nil || *resp.LedgerEntry != *entry {
			return fmt.Errorf("the stored response names ledger entry %v, the ledger has %d", resp.LedgerEntry, *entry)
		}
		return nil
	}
}

// The crash kit over the receiver's flow: a crash at every phase boundary,
// a lost commit acknowledgement, a serialization failure, a takeover, and
// (through a fault proxy) every round trip to Postgres lost or stalled.
// Every scenario ends with one event row and one ledger entry.
func TestExploreEveryCrashPoint(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewSchema(t)
	require.NoError(t, Migrate(context.Background(), schema.Pool, schema.Name))
	receiver, err := NewReceiver(schema.Name, nil)
	require.NoError(t, err)
	var ev Event
	require.NoError(t, json.Unmarshal(stripeEvent(t, "evt_explore", "payment_intent.succeeded", "acct_1", 2500), &ev))

	rep := idemtest.Explore(t, idemtest.Config[Event]{
		Pool: schema.Pool, Schema: schema.Name, DatabaseURL: schema.URL,
		Flow: receiver.Flow(), Input: ev,
		Scope: "webhook:stripe/acct_1", Path: "/webhooks/stripe",
		Compare: idemtest.EqualJSON("ledger_entry"),
		Check:   bookedOnce(schema),
	})
	require.Equal(t, []string{PhaseEventRecorded, PhaseLedgerBooked, PhaseResponded}, rep.Phases)
	require.Empty(t, rep.Unreached)
	failed := 0
	for _, s := range rep.Scenarios {
		if s.Failed() {
			failed++
		}
	}
	require.Zero(t, failed)
	require.Positive(t, rep.RoundTrips, "the fault proxy saw the flow's round trips")
	require.Len(t, rep.Scenarios, 3*5+2*rep.RoundTrips)
	t.Logf("crash kit over %s: %d scenarios (%d at phase boundaries, %d wire over %d round trips), %d failed",
		FlowName, len(rep.Scenarios), len(rep.Scenarios)-2*rep.RoundTrips, 2*rep.RoundTrips, rep.RoundTrips, failed)
}
