package docsnippets

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/pgstore"
)

type ticket struct {
	Seat string `json:"seat"`
}

// provider holds docs/testing.md, "idemtest.Provider": the phase's side and
// the test's, in one function so that they compile.
func provider(ctx context.Context, run *idem.Attempt[ticket], cfg *idemtest.Config[ticket]) (idemtest.Effect, error) {
	payments := &idemtest.Provider{}

	// In the phase: one call through the runner, sending the key it hands out.
	var charge idemtest.Effect
	err := run.Foreign(ctx, "charge", func(ctx context.Context, key string) error {
		var err error
		charge, err = payments.Do(ctx, key, run.Key().Key) // the key, and what the effect is for
		return err
	})

	// In the test:
	cfg.Providers = []idemtest.FakeProvider{payments}
	cfg.Check = func(ctx context.Context, key *idemtype.KeyRecord) error { return payments.ExpectOne(key.Key) }
	return charge, err
}

// requireOneTicket stands for a test's invariant.
func requireOneTicket(t *testing.T, key string) {}

// faultProxy holds docs/testing.md, "Network faults: the fault proxy".
// idemtest's TestFaultProxyLosesEachReplyOfAFlow runs the same, with more
// checks.
func faultProxy(ctx context.Context, t *testing.T, databaseURL string, directPool *pgxpool.Pool, flow *idem.Flow[ticket]) {
	proxy, err := idemtest.StartFaultProxy(ctx, databaseURL) // the postgres:// URL, or host:port
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	proxied, err := proxy.URL(databaseURL) // same user, password, database and parameters; sslmode=disable
	require.NoError(t, err)
	pool, err := pgxpool.New(ctx, proxied) // give this pool to the code under test
	require.NoError(t, err)
	pool.Close()

	clock := idemtest.NewClock(time.Now())
	run := func(databaseURL, key string) (*idem.Outcome, error) {
		// A new pool each time: every run starts with empty statement caches,
		// so round trip N is the same statement in every run.
		pool, err := pgxpool.New(ctx, databaseURL)
		require.NoError(t, err)
		defer pool.Close()
		// Marks, heartbeats and re-reads go straight to the database (ControlDB),
		// so the proxy breaks only the request's own round trips.
		store, err := pgstore.New(pool, &pgstore.Config{ControlDB: directPool})
		require.NoError(t, err)
		runner, err := idem.NewRunner(store, &idem.Config{
			Flows: []idem.AnyFlow{flow},
			Lease: 10 * time.Second,
			Test:  idem.TestConfig{Now: clock.Now},
		})
		require.NoError(t, err)
		return runner.Execute(ctx, flow, idem.Request{Scope: "test", Key: key, Params: ticket{Seat: "12A"}})
	}

	before := proxy.Commands()
	_, err = run(proxied, "measure")
	require.NoError(t, err)
	trips := int(proxy.Commands() - before) // 8 for this flow

	for n := 1; n <= trips; n++ {
		key := fmt.Sprint("lost-", n)
		lost := proxy.LoseReply(idemtest.Rule{Nth: n})
		out, err := run(proxied, key)
		<-lost.Done()
		if err != nil { // a lost commit reply is resolved by the runner itself
			// Retry like a client, from a new process, once the lease ran out.
			clock.Advance(11 * time.Second)
			out, err = run(databaseURL, key)
			require.NoError(t, err)
		}
		require.Equal(t, http.StatusCreated, out.Response.Status)
		requireOneTicket(t, key) // your invariant: the effect happened once
	}
}
