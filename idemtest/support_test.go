package idemtest_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/pgstore"
)

// fakeGateway is a user's own fake provider, with its own shape: the kit
// audits it through its Calls method alone, with no bridge to
// idemtest.Provider.
type fakeGateway struct {
	mu       sync.Mutex
	requests []gatewayRequest
	sent     map[string]bool // by idempotency key
	dropKeys bool            // the bug: the key never reaches the gateway
}

type gatewayRequest struct{ idempotencyKey, to string }

func (g *fakeGateway) Send(key, to string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.dropKeys {
		key = ""
	}
	g.requests = append(g.requests, gatewayRequest{key, to})
	if g.sent == nil {
		g.sent = map[string]bool{}
	}
	g.sent[key] = true
}

func (g *fakeGateway) Calls() []idemtest.ProviderCall {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]idemtest.ProviderCall, len(g.requests))
	for i, r := range g.requests {
		out[i] = idemtest.ProviderCall{Key: r.idempotencyKey, Subject: r.to}
	}
	return out
}

func gatewayFlow(name string, g *fakeGateway) *idem.Flow[orderInput] {
	return idem.MustNewFlow(name, []idem.Phase[orderInput]{{
		Name: "sent",
		Do: func(ctx context.Context, _ idem.Tx, run *idem.Attempt[orderInput]) (idem.Result, error) {
			err := run.Foreign(ctx, "send", func(_ context.Context, key string) error {
				g.Send(key, run.Input().Item)
				return nil
			})
			return idem.RespondJSON(http.StatusAccepted, map[string]string{"status": "sent"}), err
		},
	}}, nil)
}

func TestOwnFakeProviderNeedsNoBridge(t *testing.T) {
	t.Parallel()
	schema := idemtest.NewSchema(t)

	good := &fakeGateway{}
	idemtest.Explore(t, idemtest.Config[orderInput]{
		Pool: schema.Pool, Flow: gatewayFlow("gateway.good", good), Input: orderInput{Item: "alice"},
		Providers: []idemtest.FakeProvider{good},
	})
	require.NotEmpty(t, good.Calls())

	bad := &fakeGateway{dropKeys: true}
	rep, err := idemtest.ExploreContext(context.Background(), idemtest.Config[orderInput]{
		Pool: schema.Pool, Flow: gatewayFlow("gateway.bad", bad), Input: orderInput{Item: "alice"},
		Providers: []idemtest.FakeProvider{bad},
	})
	require.NoError(t, err)
	require.True(t, rep.Baseline.Failed())
	require.Contains(t, rep.Err().Error(), `provider 0 received a call for "alice" with no idempotency key`)
}

// NewSchema is a migrated schema of the test's own: idem's tables are there,
// pgstore accepts it, and its pool's search_path is the schema.
func TestNewSchemaIsMigratedAndOwn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := idemtest.NewSchema(t), idemtest.NewSchema(t)
	require.NotEqual(t, a.Name, b.Name)

	store, err := pgstore.New(a.Pool, nil)
	require.NoError(t, err)
	t.Cleanup(store.Close)
	var searchPath string
	require.NoError(t, a.Pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&searchPath))
	require.Equal(t, a.Name, searchPath)

	// URL reaches the same schema from a pool of the caller's own.
	own, err := pgxpool.New(ctx, a.URL)
	require.NoError(t, err)
	defer own.Close()
	var n int
	require.NoError(t, own.QueryRow(ctx, `SELECT count(*) FROM idem_keys`).Scan(&n))
	require.Zero(t, n)

	_, err = a.Pool.Exec(ctx, `CREATE TABLE mine (id int)`)
	require.NoError(t, err)
	_, err = b.Pool.Exec(ctx, `SELECT 1 FROM mine`)
	require.Error(t, err, "a table of one schema is not in the other")
}

// OpenSchema is for code without a testing.TB; Close closes the pool and
// empties the schema (dropped, or kept empty for a later test), and
// a second Close does nothing.
func TestOpenSchemaCloses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := idemtest.OpenSchema(ctx)
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, `CREATE TABLE orders (id int); INSERT INTO orders VALUES (1);
		INSERT INTO idem_keys (scope, key, flow, method, path, fingerprint, params, expires_at)
		VALUES ('s', 'k', 'f', 'POST', '/', '\x00', '{}', now() + interval '1 day')`)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close())
	require.Error(t, s.Pool.Ping(ctx), "the pool is closed")

	// The schema is gone, or emptied for a later test: nothing of this one is left in it.
	check := idemtest.NewSchema(t) // another pool on the same database
	var leftovers int
	require.NoError(t, check.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_class
		WHERE relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = $1) AND relname = 'orders'`, s.Name).Scan(&leftovers))
	require.Zero(t, leftovers, "the test's table is dropped")
	var kept bool
	require.NoError(t, check.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, s.Name).Scan(&kept))
	if kept {
		require.NoError(t, check.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %q.idem_keys`, s.Name)).Scan(&leftovers))
		require.Zero(t, leftovers, "idem's tables are emptied")
	}
}
