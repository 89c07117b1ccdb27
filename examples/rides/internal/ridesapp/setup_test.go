package ridesapp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/examples/rides/fakepay"
	"github.com/go-idem/idem/examples/rides/internal/ridesapp"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testLogger discards the app's logs, which would drown a failure's
// output; RIDES_TEST_LOG=1 sends them to stderr.
var testLogger = func() *slog.Logger {
	if os.Getenv("RIDES_TEST_LOG") == "1" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}()

// testBundle is a migrated schema of the test's own, an in-process fakepay,
// the rides app on both, and its API behind an httptest server.
type testBundle struct {
	schema   *pgtest.Schema
	pool     *pgxpool.Pool
	app      *ridesapp.App
	provider *fakepay.Server
	ledger   *fakepay.Client
	payments *payments
	api      *httptest.Server
	clock    *idemtest.Clock
	hook     atomic.Pointer[func(context.Context, idemtest.HookPoint) error]
	// proxy stands between the app and the database when options.proxied.
	proxy *idemtest.FaultProxy

	goodUserID, badUserID int64
	// citus: the app runs on Citus (options.citus).
	citus bool
}

type options struct {
	// fakepay configures the provider; nil means a well-behaved one.
	fakepay *fakepay.Config
	// work runs the receipt worker in-process.
	work bool
	// proxied puts a fault proxy (testBundle.proxy) between the app and
	// the database, and bounds the runner's statements by statementTimeout.
	proxied          bool
	statementTimeout time.Duration
	// citus runs the app on the test binary's Citus cluster, its tables
	// laid out by MigrateCitus (skipped loudly without Citus).
	citus bool
}

func setup(t *testing.T, opts *options) *testBundle {
	t.Helper()
	if opts == nil {
		opts = &options{}
	}
	ctx := context.Background()
	var schema *pgtest.Schema
	if opts.citus {
		schema = pgtest.NewCitusSchema(t)
		require.NoError(t, ridesapp.MigrateCitus(ctx, schema.Pool, schema.Name, testLogger))
	} else {
		schema = pgtest.NewSchema(t)
		require.NoError(t, ridesapp.Migrate(ctx, schema.Pool, schema.Name, testLogger))
	}
	require.NoError(t, ridesapp.Seed(ctx, schema.Pool, schema.Name))

	fakepayConfig := fakepay.Config{}
	if opts.fakepay != nil {
		fakepayConfig = *opts.fakepay
	}
	fakepayConfig.Logger = testLogger
	provider, err := fakepay.New(&fakepayConfig)
	require.NoError(t, err)
	providerServer := httptest.NewServer(provider)
	t.Cleanup(providerServer.Close)

	b := &testBundle{
		schema:   schema,
		pool:     schema.Pool,
		provider: provider,
		ledger:   &fakepay.Client{BaseURL: providerServer.URL},
		clock:    idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
		citus:    opts.citus,
	}
	b.payments = &payments{inner: b.ledger}
	appPool := schema.Pool
	if opts.proxied {
		b.proxy, err = idemtest.StartFaultProxy(ctx, schema.URL)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, b.proxy.Close()) })
		url, err := b.proxy.URL(schema.URL)
		require.NoError(t, err)
		appPool, err = pgxpool.New(ctx, url)
		require.NoError(t, err)
		t.Cleanup(appPool.Close)
	}
	b.app, err = ridesapp.New(&ridesapp.Config{
		Pool:     appPool,
		Schema:   schema.Name,
		Payments: b.payments,
		Runner: &idem.Config{
			PhaseRetryBackoff: time.Millisecond,
			StatementTimeout:  opts.statementTimeout,
			Test: idemtest.WithHook(idem.TestConfig{Now: b.clock.Now}, func(ctx context.Context, at idemtest.HookPoint) error {
				if h := b.hook.Load(); h != nil {
					return (*h)(ctx, at)
				}
				return nil
			}),
		},
		Queue:  ridesapp.QueueConfig{Work: opts.work},
		Logger: testLogger,
	})
	require.NoError(t, err)
	if opts.work {
		require.NoError(t, b.app.Start(ctx))
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, b.app.Stop(ctx))
	})
	b.api = httptest.NewServer(b.app.Handler())
	t.Cleanup(b.api.Close)

	require.NoError(t, b.pool.QueryRow(ctx, `SELECT id FROM users WHERE email = $1`, ridesapp.GoodUserEmail).Scan(&b.goodUserID))
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT id FROM users WHERE email = $1`, ridesapp.BadSourceUserEmail).Scan(&b.badUserID))
	return b
}

// setHook installs a runner test hook for the rest of the test.
func (b *testBundle) setHook(h func(context.Context, idemtest.HookPoint) error) {
	if h == nil {
		b.hook.Store(nil)
		return
	}
	b.hook.Store(&h)
}

// crashAt makes the runner die, as a killed process would, the first time
// it reaches where in phase.
func (b *testBundle) crashAt(phase string, where idemtest.HookWhere) {
	var once sync.Once
	b.setHook(func(_ context.Context, at idemtest.HookPoint) error {
		crash := false
		if at.Phase == phase && at.Where == where {
			once.Do(func() { crash = true })
		}
		if crash {
			return idemtest.ErrSimulatedCrash
		}
		return nil
	})
}

const validBody = `{"origin_lat": 37.7749, "origin_lon": -122.4194, "target_lat": 37.8044, "target_lon": -122.2712}`

// otherBody is a valid ride request other than validBody.
const otherBody = `{"origin_lat": 37.7749, "origin_lon": -122.4194, "target_lat": 37.3382, "target_lon": -121.8863}`

// newKey returns a fresh key, a UUID as real clients send.
func newKey() string { return uuid.NewString() }

// response is an API answer.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r *response) problem(t *testing.T) map[string]any {
	t.Helper()
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"), "body: %s", r.body)
	var m map[string]any
	require.NoError(t, json.Unmarshal(r.body, &m), "body: %s", r.body)
	return m
}

func (r *response) ride(t *testing.T) ridesapp.RideResponse {
	t.Helper()
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	require.Equal(t, "application/json", r.header.Get("Content-Type"))
	var ride ridesapp.RideResponse
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&ride))
	return ride
}

// post sends POST /rides. An empty auth sends no Authorization header, an
// empty key no Idempotency-Key.
func (b *testBundle) post(t *testing.T, auth, key, body string) (*response, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.api.URL+"/rides", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.GetBody = nil // count every attempt: no transparent resend
	resp, err := b.api.Client().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return &response{status: resp.StatusCode, header: resp.Header, body: data}, nil
}

// postOK is post for attempts that must get an answer.
func (b *testBundle) postOK(t *testing.T, auth, key, body string) *response {
	t.Helper()
	r, err := b.post(t, auth, key, body)
	require.NoError(t, err)
	return r
}

// ride posts a valid ride request as the good user.
func (b *testBundle) ride(t *testing.T, key string) *response {
	t.Helper()
	return b.postOK(t, "Bearer "+ridesapp.GoodUserEmail, key, validBody)
}

func (b *testBundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func (b *testBundle) key(t *testing.T, userID int64, key string) *idemtype.KeyRecord {
	t.Helper()
	rec, err := b.app.Store().GetKey(context.Background(), "user:"+itoa(userID), key)
	require.NoError(t, err)
	return rec
}

func (b *testBundle) noKey(t *testing.T, userID int64, key string) {
	t.Helper()
	_, err := b.app.Store().GetKey(context.Background(), "user:"+itoa(userID), key)
	require.ErrorIs(t, err, idem.ErrNotFound)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// payments wraps the fakepay client so a test can make the next charge
// calls fail before they reach the provider.
type payments struct {
	inner *fakepay.Client
	calls atomic.Int64
	fail  atomic.Pointer[func() error]
}

func (p *payments) CreateCharge(ctx context.Context, key string, params fakepay.ChargeParams) (*fakepay.Charge, error) {
	p.calls.Add(1)
	if f := p.fail.Load(); f != nil {
		if err := (*f)(); err != nil {
			return nil, err
		}
	}
	return p.inner.CreateCharge(ctx, key, params)
}

// failWith makes every charge call fail with err until cleared with nil.
func (p *payments) failWith(err error) {
	if err == nil {
		p.fail.Store(nil)
		return
	}
	f := func() error { return err }
	p.fail.Store(&f)
}

var errInternal = errors.New("internal server error!")
