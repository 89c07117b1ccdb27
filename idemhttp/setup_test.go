package idemhttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/internal/testfixture"
	"github.com/go-idem/idem/pgstore"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// bundle is what the handler tests share: a migrated schema of their own, a
// runner on it with a controllable clock, and rides-like flows whose phases
// count their runs and take injected behaviour.
type bundle struct {
	schema   *pgtest.Schema
	pool     *pgxpool.Pool
	store    *pgstore.Store
	clock    *idemtest.Clock
	profile  idemhttp.Profile
	counts   *testfixture.PhaseCounts
	provider *testfixture.Provider
	runner   *idem.Runner
	flow     *idem.Flow[rideInput] // rides.create: three phases
	quote    *idem.Flow[rideInput] // rides.quote: another endpoint, same input
	sms      *idem.Flow[smsInput]  // sms.send: a not-idempotent foreign call that fails

	hooksMu sync.Mutex
	hooks   map[string]func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) error
}

const (
	testScope = "user:alice"
	testAuth  = "Bearer alice"
)

func setup(t testing.TB, profile idemhttp.Profile) *bundle {
	t.Helper()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	_, err := schema.Pool.Exec(ctx, `
		CREATE TABLE rides (id bigserial PRIMARY KEY, key_id bigint REFERENCES idem_keys (id) ON DELETE SET NULL,
		                    user_id text NOT NULL, origin text NOT NULL, charge_id text)`)
	require.NoError(t, err)
	store, err := pgstore.New(schema.Pool, &pgstore.Config{Schema: schema.Name})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	b := &bundle{
		schema: schema, pool: schema.Pool, store: store, profile: profile,
		clock:    idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
		counts:   &testfixture.PhaseCounts{},
		provider: &testfixture.Provider{},
		hooks:    map[string]func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error{},
	}
	b.flow = b.rideFlow(nil)
	b.quote = idem.MustNewFlow("rides.quote", []idem.Phase[rideInput]{{
		Name: "quoted",
		Do: func(context.Context, idem.Tx, *idem.Attempt[rideInput]) (idem.Result, error) {
			b.counts.Add("quoted")
			return idem.RespondJSON(http.StatusOK, map[string]int{"price": 42}), nil
		},
	}}, nil)
	b.sms = idem.MustNewFlow("sms.send", []idem.Phase[smsInput]{{
		Name:    "sms_sent",
		Foreign: idem.ForeignNotIdempotent,
		Do: func(ctx context.Context, _ idem.Tx, run *idem.Attempt[smsInput]) (idem.Result, error) {
			b.counts.Add("sms_sent")
			if err := run.Foreign(ctx, "send_sms", func(context.Context, string) error { return nil }); err != nil {
				return idem.Result{}, err
			}
			// The gateway took the message, but the phase cannot commit:
			// whether the SMS went out is now unknown.
			return idem.Result{}, errors.New("connection reset after the gateway accepted the message")
		},
		Reconcile: func(context.Context, idem.Tx, *idem.Attempt[smsInput]) (idem.ReconcileVerdict, error) {
			return idem.ReconcileUnknown("the gateway cannot tell"), nil
		},
	}}, nil)
	b.runner = b.newRunner(t, nil)
	return b
}

// newRunner returns a runner on the bundle's store and clock, as a new
// process would make one.
func (b *bundle) newRunner(t testing.TB, cfg *idem.Config) *idem.Runner {
	t.Helper()
	if cfg == nil {
		cfg = &idem.Config{}
	}
	if cfg.Test.Now == nil {
		cfg.Test.Now = b.clock.Now
	}
	cfg.Flows = []idem.AnyFlow{b.flow, b.quote, b.sms}
	r, err := idem.NewRunner(b.store, cfg)
	require.NoError(t, err)
	return r
}

type rideInput struct {
	// UserID is derived from authentication by Config.Prepare.
	UserID string `json:"user_id"`
	Origin string `json:"origin"`
	Amount int    `json:"amount"`
}

type smsInput struct {
	To string `json:"to"`
}

// config is the handler configuration the tests start from, shaped like the
// rides service's.
func (b *bundle) config() *idemhttp.Config[rideInput] {
	return &idemhttp.Config[rideInput]{
		Scope: bearerScope,
		Prepare: func(r *http.Request, in *rideInput) error {
			in.UserID = strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
			return nil
		},
		Validate: func(in *rideInput) []idemhttp.FieldError {
			var errs []idemhttp.FieldError
			if in.Origin == "" {
				errs = append(errs, idemhttp.FieldError{Field: "origin", Detail: "is required"})
			}
			if in.Amount <= 0 {
				errs = append(errs, idemhttp.FieldError{Field: "amount", Detail: "must be positive"})
			}
			return errs
		},
		Profile:       b.profile,
		ReplayHeaders: []string{"Location"},
		AuthChallenge: `Bearer realm="rides"`,
		// The tests of a key in flight see its 409 at once; those of
		// DefaultWait set it.
		DefaultWait: -1,
	}
}

func bearerScope(r *http.Request) (string, error) {
	user, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || user == "" {
		return "", idemhttp.ErrUnauthenticated
	}
	return "user:" + user, nil
}

// handler returns a handler for the rides flow on the bundle's runner;
// adjust changes the configuration first.
func (b *bundle) handler(t testing.TB, adjust func(*idemhttp.Config[rideInput])) *idemhttp.Handler[rideInput] {
	t.Helper()
	return b.handlerOn(t, b.runner, b.flow, adjust)
}

func (b *bundle) handlerOn(t testing.TB, r *idem.Runner, flow *idem.Flow[rideInput], adjust func(*idemhttp.Config[rideInput])) *idemhttp.Handler[rideInput] {
	t.Helper()
	cfg := b.config()
	if adjust != nil {
		adjust(cfg)
	}
	h, err := idemhttp.New(r, flow, cfg)
	require.NoError(t, err)
	return h
}

func (b *bundle) setHook(phase string, hook func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) error) {
	b.hooksMu.Lock()
	defer b.hooksMu.Unlock()
	if hook == nil {
		delete(b.hooks, phase)
		return
	}
	b.hooks[phase] = hook
}

// failOnce makes phase fail with fail's error the first time it runs, and
// succeed after: a request that fails once, then is retried or completed.
func (b *bundle) failOnce(phase string, fail func() error) {
	var failed atomic.Bool
	b.setHook(phase, func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		if failed.Swap(true) {
			return nil
		}
		return fail()
	})
}

func (b *bundle) hook(phase string) func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) error {
	b.hooksMu.Lock()
	defer b.hooksMu.Unlock()
	return b.hooks[phase]
}

// rideFlow mirrors rocket-rides-atomic: create the ride, charge it through
// an idempotent provider, respond 201 with headers of every kind, some of
// which must never reach a client.
func (b *bundle) rideFlow(config *idem.FlowConfig[rideInput]) *idem.Flow[rideInput] {
	run := func(phase string, ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) error {
		b.counts.Add(phase)
		if h := b.hook(phase); h != nil {
			return h(ctx, tx, run)
		}
		return nil
	}
	return idem.MustNewFlow("rides.create", []idem.Phase[rideInput]{
		{
			Name: "ride_created",
			Do: func(ctx context.Context, tx idem.Tx, r *idem.Attempt[rideInput]) (idem.Result, error) {
				if err := run("ride_created", ctx, tx, r); err != nil {
					return idem.Result{}, err
				}
				var id int64
				if err := tx.QueryRow(ctx, `INSERT INTO rides (key_id, user_id, origin) VALUES ($1, $2, $3) RETURNING id`,
					r.Key().ID, r.Input().UserID, r.Input().Origin).Scan(&id); err != nil {
					return idem.Result{}, err
				}
				return idem.Advance(), r.SetCheckpoint("ride_id", id)
			},
		},
		{
			Name: "charge_created",
			Do: func(ctx context.Context, tx idem.Tx, r *idem.Attempt[rideInput]) (idem.Result, error) {
				if err := run("charge_created", ctx, tx, r); err != nil {
					return idem.Result{}, err
				}
				var chargeID string
				if err := r.Foreign(ctx, "charge", func(_ context.Context, key string) error {
					var err error
					chargeID, err = b.provider.Charge(key, float64(r.Input().Amount))
					return err
				}); err != nil {
					return idem.Result{}, err
				}
				return idem.Advance(), r.SetCheckpoint("charge_id", chargeID)
			},
		},
		{
			Name: "responded",
			Do: func(ctx context.Context, tx idem.Tx, r *idem.Attempt[rideInput]) (idem.Result, error) {
				if err := run("responded", ctx, tx, r); err != nil {
					return idem.Result{}, err
				}
				var rideID int64
				var chargeID string
				if _, err := r.Checkpoint("ride_id", &rideID); err != nil {
					return idem.Result{}, err
				}
				if _, err := r.Checkpoint("charge_id", &chargeID); err != nil {
					return idem.Result{}, err
				}
				return idem.Respond(http.StatusCreated, http.Header{
					"content-type":  {"application/json"}, // not canonical on purpose
					"Location":      {fmt.Sprintf("/rides/%d", rideID)},
					"X-Ride":        {fmt.Sprint(rideID)},
					"Set-Cookie":    {"session=s3cret"},
					"Authorization": {"Bearer leaked"},
					"Connection":    {"close"},
					"Cache-Control": {"no-store"},
				}, fmt.Appendf(nil, "{\"ride_id\": %d,  \"charge_id\": %q}\n", rideID, chargeID)), nil
			},
		},
	}, config)
}

// request builds a POST to /rides with the given Idempotency-Key ("" sends
// none) and body, as alice.
func request(key, body string) *http.Request {
	return requestTo(http.MethodPost, "/rides", key, body)
}

// requestTo is request with another method and target.
func requestTo(method, target, key, body string) *http.Request {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", testAuth)
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	return r
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

func post(h http.Handler, key, body string) *httptest.ResponseRecorder {
	return serve(h, request(key, body))
}

const rideBody = `{"origin": "SFO", "amount": 20}`

// keyRow returns alice's key row, or nil when there is none.
func (b *bundle) keyRow(t testing.TB, key string) *idemtype.KeyRecord {
	t.Helper()
	rec, err := b.store.GetKey(context.Background(), testScope, key)
	if errors.Is(err, idem.ErrNotFound) {
		return nil
	}
	require.NoError(t, err)
	return rec
}

func (b *bundle) countRows(t testing.TB, table string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

// requireNothingWritten checks that bad input left no trace: no key row,
// no phase run, no business row.
func (b *bundle) requireNothingWritten(t testing.TB) {
	t.Helper()
	require.Zero(t, b.countRows(t, "idem_keys"), "bad input must be refused before any key is written")
	require.Zero(t, b.countRows(t, "rides"))
	require.Empty(t, b.counts.Get())
}

// requireFinished checks that key holds the stored 201 of one execution.
func (b *bundle) requireFinished(t testing.TB, key string, res *httptest.ResponseRecorder) {
	t.Helper()
	row := b.keyRow(t, key)
	require.NotNil(t, row)
	require.Equal(t, idemtype.StoredFinished, row.Status)
	require.Equal(t, idemtype.RecoveryPointFinished, row.RecoveryPoint)
	require.Nil(t, row.LockedAt)
	require.Equal(t, http.StatusCreated, row.ResponseStatus)
	require.Equal(t, res.Body.Bytes(), row.ResponseBody)
	require.NotNil(t, row.ExpiresAt)
	require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 1, "responded": 1}, b.counts.Get())
	require.Equal(t, 1, b.countRows(t, "rides"))
	require.Equal(t, 1, b.provider.Charges())
}

// problemJSON is a decoded problem response, both profiles' members.
type problemJSON struct {
	Type   string                `json:"type"`
	Title  string                `json:"title"`
	Status int                   `json:"status"`
	Detail string                `json:"detail"`
	Errors []idemhttp.FieldError `json:"errors"`
	Code   string                `json:"code"`
	Error  *idemhttp.StripeError `json:"error"`
}

func decodeProblem(t testing.TB, res *httptest.ResponseRecorder) *problemJSON {
	t.Helper()
	require.Equal(t, "application/problem+json", res.Header().Get("Content-Type"), "body: %s", res.Body)
	var p problemJSON
	dec := json.NewDecoder(strings.NewReader(res.Body.String()))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&p), "body: %s", res.Body)
	_, err := dec.Token()
	require.ErrorIs(t, err, io.EOF)
	return &p
}

// blockPhase makes the next run of phase wait, after signalling entered,
// until release is called (at the latest when t ends). Later runs pass
// straight through.
func (b *bundle) blockPhase(t testing.TB, phase string) (entered <-chan struct{}, release func()) {
	pause := testfixture.NewPause(t)
	b.setHook(phase, func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error {
		pause.Hold(context.Background())
		return nil
	})
	return pause.Reached(), pause.Release
}

// exampleDatabaseURL gives an Example, which has no *testing.T, a fresh
// schema on the test binary's database (see internal/pgtest). It stands for
// os.Getenv("DATABASE_URL") in a real service. The schema needs no cleanup:
// it goes with the test database when pgtest.Main stops the server.
func exampleDatabaseURL() string {
	schema, _, err := pgtest.OpenSchema(context.Background())
	if err != nil {
		panic(err)
	}
	return schema.URL
}
