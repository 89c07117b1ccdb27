package idemtest_test

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/pgtest"
)

// The mutant suite: a three-phase order flow written the way a new user
// writes one from docs/testing.md (reserve stock by decrementing a product
// row, charge a payment fake of the user's own, create a shipment), with
// the invariants a team writes (one order per key, stock conserved, one
// charge per charged order, shipments only for charged orders, from the
// order's warehouse and date). The correct flow must pass every scenario
// kind, stalled replies on a shared product row included; each planted bug
// must be caught, and the table says by which scenario and which check.

type bug string

const (
	correct             bug = ""
	freshProviderKey    bug = "a fresh random provider key"
	poolWrite           bug = "a pool write in a phase"
	unregisteredCall    bug = "an unregistered call"
	swallowedSecondCall bug = "a swallowed second foreign call"
	writeBeforeCharge   bug = "a write before the charge in the charge phase"
	rerunPoolDecrement  bug = "a re-run pool decrement"
	decrementInForeign  bug = "the same inside the foreign call"
	stateInMemory       bug = "state in memory between phases"
	timeReadTwice       bug = "time read twice"
	nonDeduplicating    bug = "a non-deduplicating provider declared idempotent"
	joinedUncommitted   bug = "a joined phase naming uncommitted rows"
)

type orderReq struct {
	SKU    string `json:"sku"`
	Qty    int    `json:"qty"`
	Amount int64  `json:"amount"`
	Card   string `json:"card"`
}

// payments is a payment provider fake as a user writes one: it
// deduplicates on the idempotency key alone (unless dedupe is off, the
// planted bug), declines the card "declined", and lists its calls for the
// kit. It does not tag calls with their scenario: the kit tells them apart.
type payments struct {
	noDedupe bool

	mu      sync.Mutex
	byKey   map[string]string // key -> charge id
	charges []charge
	calls   []idemtest.ProviderCall
}

type charge struct{ id, key, subject string }

var errDeclined = errors.New("card declined")

func (p *payments) Charge(ctx context.Context, key, subject, card string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	call := idemtest.ProviderCall{Key: key, Subject: subject}
	defer func() { p.calls = append(p.calls, call) }()
	if card == "declined" {
		call.Err = errDeclined
		return "", errDeclined
	}
	if id, ok := p.byKey[key]; ok && !p.noDedupe {
		call.Effect, call.Deduplicated = id, true
		return id, nil
	}
	id := fmt.Sprintf("ch_%d", len(p.charges)+1)
	if p.byKey == nil {
		p.byKey = map[string]string{}
	}
	p.byKey[key] = id
	p.charges = append(p.charges, charge{id, key, subject})
	call.Effect = id
	return id, nil
}

func (p *payments) Calls() []idemtest.ProviderCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls)
}

func (p *payments) chargesFor(subject string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.charges {
		if c.subject == subject {
			n++
		}
	}
	return n
}

// mailer is an email service nobody registers in Providers.
type mailer struct {
	mu   sync.Mutex
	sent map[string]int
}

func (m *mailer) Send(to string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sent == nil {
		m.sent = map[string]int{}
	}
	m.sent[to]++
}

func (m *mailer) count(to string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sent[to]
}

type shop struct {
	pool   *pgxpool.Pool
	url    string
	pay    *payments
	mail   *mailer
	shared bool // one product row for every scenario
}

func newShop(t *testing.T) *shop {
	t.Helper()
	schema := pgtest.NewMigratedSchema(t)
	_, err := schema.Pool.Exec(context.Background(), `
		CREATE TABLE products (sku text PRIMARY KEY, stock int NOT NULL CHECK (stock >= 0), initial int NOT NULL);
		CREATE TABLE orders (
			id         bigserial PRIMARY KEY,
			scope      text NOT NULL,
			idem_key   text NOT NULL,
			sku        text NOT NULL REFERENCES products (sku),
			qty        int NOT NULL,
			warehouse  text NOT NULL,
			order_date date NOT NULL,
			status     text NOT NULL DEFAULT 'reserved',
			charge_id  text
		);
		CREATE TABLE shipments (id bigserial PRIMARY KEY, order_id bigint NOT NULL REFERENCES orders (id), warehouse text NOT NULL, order_date date NOT NULL);
		CREATE TABLE audit (id bigserial PRIMARY KEY, what text NOT NULL);
		CREATE TABLE payment_attempts (id bigserial PRIMARY KEY, order_id bigint NOT NULL);
		INSERT INTO products VALUES ('shared', 100000, 100000)`)
	require.NoError(t, err)
	return &shop{pool: schema.Pool, url: schema.URL, pay: &payments{}, mail: &mailer{}}
}

var warehousesList = []string{"north", "south", "east", "west"}

// newFlow builds the order flow with bug planted. Each call makes new flow
// values: the in-memory state of stateInMemory lives in them.
func (s *shop) newFlow(b bug) *idem.Flow[orderReq] {
	// The planted stateInMemory keeps each order's warehouse here, for
	// phase 3, instead of reading the order's row.
	warehouses := map[int64]string{}
	var mu sync.Mutex
	orderOf := func(run *idem.Attempt[orderReq]) (int64, error) {
		var id int64
		ok, err := run.Checkpoint("order_id", &id)
		if err == nil && !ok {
			err = errors.New("no order_id checkpoint")
		}
		return id, err
	}
	chargeAt := idem.ForeignIdempotent
	return idem.MustNewFlow("orders.place", []idem.Phase[orderReq]{
		{
			Name: "reserved",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[orderReq]) (idem.Result, error) {
				in := run.Input()
				var db idem.Tx = tx
				if b == rerunPoolDecrement {
					db = s.pool // the bug: the decrement commits on its own
				}
				if b != decrementInForeign {
					tag, err := db.Exec(ctx, `UPDATE products SET stock = stock - $2 WHERE sku = $1 AND stock >= $2`, in.SKU, in.Qty)
					if err != nil {
						return idem.Result{}, err
					}
					if tag.RowsAffected() == 0 {
						return idem.RespondJSON(http.StatusConflict, map[string]any{"error": "out of stock"}), nil
					}
				}
				warehouse := warehousesList[rand.IntN(len(warehousesList))]
				var id int64
				err := tx.QueryRow(ctx, `INSERT INTO orders (scope, idem_key, sku, qty, warehouse, order_date) VALUES ($1, $2, $3, $4, $5, $6) RETURNING id`,
					run.Key().Scope, run.Key().Key, in.SKU, in.Qty, warehouse, run.Now().UTC().Format(time.DateOnly)).Scan(&id)
				if err != nil {
					return idem.Result{}, err
				}
				if b == poolWrite {
					if _, err := s.pool.Exec(ctx, `INSERT INTO audit (what) VALUES ($1)`, fmt.Sprint("reserved order ", id)); err != nil {
						return idem.Result{}, err
					}
				}
				if b == stateInMemory {
					mu.Lock()
					warehouses[id] = warehouse
					mu.Unlock()
				}
				return idem.Advance(), run.SetCheckpoint("order_id", id)
			},
		},
		{
			Name:         "charged",
			Foreign:      chargeAt,
			JoinPrevious: b == joinedUncommitted,
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[orderReq]) (idem.Result, error) {
				in := run.Input()
				id, err := orderOf(run)
				if err != nil {
					return idem.Result{}, err
				}
				if b == writeBeforeCharge {
					if _, err := s.pool.Exec(ctx, `INSERT INTO payment_attempts (order_id) VALUES ($1)`, id); err != nil {
						return idem.Result{}, err
					}
				}
				var chargeID string
				err = run.Foreign(ctx, "charge", func(ctx context.Context, key string) error {
					if b == freshProviderKey {
						key = randomKey()
					}
					if b == decrementInForeign {
						if _, err := s.pool.Exec(ctx, `UPDATE products SET stock = stock - $2 WHERE sku = $1`, in.SKU, in.Qty); err != nil {
							return err
						}
					}
					var err error
					chargeID, err = s.pay.Charge(ctx, key, fmt.Sprint("order:", id), in.Card)
					return err
				})
				if errors.Is(err, errDeclined) {
					if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'declined' WHERE id = $1`, id); err != nil {
						return idem.Result{}, err
					}
					if _, err := tx.Exec(ctx, `UPDATE products SET stock = stock + $2 WHERE sku = $1`, in.SKU, in.Qty); err != nil {
						return idem.Result{}, err
					}
					return idem.RespondJSON(http.StatusPaymentRequired, map[string]any{"order_id": id, "error": "card declined"}), nil
				}
				if err != nil {
					return idem.Result{}, err
				}
				if b == swallowedSecondCall {
					if err := run.Foreign(ctx, "email", func(ctx context.Context, key string) error { return nil }); err != nil {
						_ = err // the bug: logged and ignored
					}
				}
				if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'charged', charge_id = $2 WHERE id = $1`, id, chargeID); err != nil {
					return idem.Result{}, err
				}
				return idem.Advance(), nil
			},
		},
		{
			Name: "shipped",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[orderReq]) (idem.Result, error) {
				id, err := orderOf(run)
				if err != nil {
					return idem.Result{}, err
				}
				var warehouse, chargeID string
				var date time.Time
				if err := tx.QueryRow(ctx, `SELECT warehouse, order_date, charge_id FROM orders WHERE id = $1`, id).Scan(&warehouse, &date, &chargeID); err != nil {
					return idem.Result{}, err
				}
				if b == stateInMemory {
					mu.Lock()
					warehouse = warehouses[id]
					mu.Unlock()
				}
				if b == timeReadTwice {
					date = run.Now().UTC() // the bug: the order's date, read again
				}
				if _, err := tx.Exec(ctx, `INSERT INTO shipments (order_id, warehouse, order_date) VALUES ($1, $2, $3)`, id, warehouse, date.Format(time.DateOnly)); err != nil {
					return idem.Result{}, err
				}
				if b == unregisteredCall {
					s.mail.Send(run.Key().Key) // the bug: a call outside Attempt.Foreign, to a provider nobody registered
				}
				return idem.RespondJSON(http.StatusCreated, map[string]any{"order_id": id, "charge_id": chargeID, "warehouse": warehouse, "order_date": date.Format(time.DateOnly)}), nil
			},
		},
	}, nil)
}

func randomKey() string {
	b := make([]byte, 8)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}

// setupInput gives each scenario a product of its own (or the shared one),
// so that "stock conserved" holds per scenario.
func (s *shop) setupInput(card string) func(ctx context.Context, key string) (orderReq, error) {
	return func(ctx context.Context, key string) (orderReq, error) {
		in := orderReq{SKU: key, Qty: 2, Amount: 500, Card: card}
		if s.shared {
			in.SKU = "shared"
			return in, nil
		}
		_, err := s.pool.Exec(ctx, `INSERT INTO products VALUES ($1, 10, 10)`, key)
		return in, err
	}
}

// check is the team's invariant for one key: one order; stock conserved;
// a charged order has one charge and one shipment, from its warehouse and
// of its date; a declined one neither.
func (s *shop) check(emails bool) func(ctx context.Context, key *idemtype.KeyRecord) error {
	return func(ctx context.Context, key *idemtype.KeyRecord) error {
		if err := s.oneOrderForTheKey(ctx, key); err != nil {
			return err
		}
		var id int64
		var sku, status, warehouse string
		var date time.Time
		err := s.pool.QueryRow(ctx, `SELECT id, sku, status, warehouse, order_date FROM orders WHERE scope = $1 AND idem_key = $2`, key.Scope, key.Key).
			Scan(&id, &sku, &status, &warehouse, &date)
		if err != nil {
			return err
		}
		var stock, initial, held int
		err = s.pool.QueryRow(ctx, `SELECT stock, initial, (SELECT coalesce(sum(qty), 0) FROM orders WHERE sku = $1 AND status <> 'declined') FROM products WHERE sku = $1`, sku).
			Scan(&stock, &initial, &held)
		if err != nil {
			return err
		}
		if stock+held != initial {
			return fmt.Errorf("stock of %s is %d with %d held by orders, want %d in all", sku, stock, held, initial)
		}
		wantCharges, wantShipments := 0, 0
		if status == "charged" {
			wantCharges, wantShipments = 1, 1
		}
		if got := s.pay.chargesFor(fmt.Sprint("order:", id)); got != wantCharges {
			return fmt.Errorf("order %d is %s with %d charges, want %d", id, status, got, wantCharges)
		}
		var shipments int
		var wrong []string
		rows, err := s.pool.Query(ctx, `SELECT warehouse, order_date FROM shipments WHERE order_id = $1`, id)
		if err != nil {
			return err
		}
		for rows.Next() {
			var w string
			var d time.Time
			if err := rows.Scan(&w, &d); err != nil {
				return err
			}
			shipments++
			if w != warehouse || !d.Equal(date) {
				wrong = append(wrong, fmt.Sprintf("from %q dated %s", w, d.Format(time.DateOnly)))
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if shipments != wantShipments {
			return fmt.Errorf("order %d is %s with %d shipments, want %d", id, status, shipments, wantShipments)
		}
		if len(wrong) > 0 {
			return fmt.Errorf("order %d, reserved at %q on %s, has a shipment %s", id, warehouse, date.Format(time.DateOnly), strings.Join(wrong, ", "))
		}
		if emails {
			if n := s.mail.count(key.Key); n != wantShipments {
				return fmt.Errorf("%d confirmation emails for the key, want %d", n, wantShipments)
			}
		}
		return nil
	}
}

// oneOrderForTheKey is the Check's first count. It counts by the request's
// scope and key, which every retry keeps.
func (s *shop) oneOrderForTheKey(ctx context.Context, key *idemtype.KeyRecord) error {
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE scope = $1 AND idem_key = $2`, key.Scope, key.Key).Scan(&n); err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("%d orders for the key, want 1", n)
	}
	return nil
}

// mutant is one run of the suite: a bug planted, what to explore, and what
// must catch it.
type mutant struct {
	bug  bug
	name string
	card string
	// wire turns the wire scenarios on; shared puts every scenario on one
	// product row.
	wire, shared bool
	// emails adds "one email per shipment" to the Check.
	emails bool
	// caughtBy: a failed scenario and a phrase of its violations. Empty
	// for the correct flow, and for a bug the kit cannot see (documented).
	caughtBy []catch
}

type catch struct{ scenario, violation string }

func mutants() []mutant {
	return []mutant{
		{name: "correct, shared row, every kind", wire: true, shared: true},
		{name: "correct, declined card", card: "declined"},
		{bug: freshProviderKey, caughtBy: []catch{{"baseline", "provider 0 received a call"}, {"baseline", "no provider received it"}}},
		{bug: poolWrite, caughtBy: []catch{{"crash_before_commit@reserved", "through a connection other than its transaction"}}},
		{bug: unregisteredCall},
		{bug: unregisteredCall, name: "an unregistered call, with a Check that counts emails", emails: true,
			caughtBy: []catch{{"crash_before_commit@shipped", "Check: 2 confirmation emails"}}},
		{bug: swallowedSecondCall, caughtBy: []catch{{"baseline", `called Attempt.Foreign for "email"`}}},
		{bug: writeBeforeCharge, caughtBy: []catch{{"crash_before_commit@charged", "payment_attempts through a connection other than its transaction"}}},
		{bug: rerunPoolDecrement, caughtBy: []catch{
			{"crash_before_commit@reserved", "products through a connection other than its transaction"},
			{"crash_before_commit@reserved", "Check: stock of"}}},
		{bug: decrementInForeign, caughtBy: []catch{{"crash_before_commit@charged", "Check: stock of"}, {"crash_after_foreign@charged", "Check: stock of"}}},
		{bug: stateInMemory, caughtBy: []catch{{"crash_after_commit@reserved", `has a shipment from ""`}}},
		{bug: timeReadTwice, caughtBy: []catch{{"crash_after_commit@reserved", "has a shipment from"}, {"crash_after_commit@charged", "has a shipment from"}}},
		{bug: nonDeduplicating, caughtBy: []catch{{"crash_before_commit@charged", "it does not deduplicate"}, {"crash_before_commit@charged", "Check: order"}}},
		{bug: joinedUncommitted, caughtBy: []catch{{"crash_before_commit@charged", "for 2 different requests"}, {"crash_before_commit@charged", "Check: order"}}},
	}
}

// TestMutantOrderFlows runs every variant at once (each on a schema of its
// own) and then holds each to its expectation, logging the table: bug,
// result, which scenarios caught it, the kit's time.
func TestMutantOrderFlows(t *testing.T) {
	t.Parallel()
	ms := mutants()
	reps := make([]*idemtest.Report, len(ms))
	errs := make([]error, len(ms))
	shops := make([]*shop, len(ms))
	for i, m := range ms {
		s := newShop(t)
		s.shared = m.shared
		s.pay.noDedupe = m.bug == nonDeduplicating
		shops[i] = s
	}
	started := time.Now()
	var wg sync.WaitGroup
	for i, m := range ms {
		s := shops[i]
		cfg := idemtest.Config[orderReq]{
			Pool:      s.pool,
			NewFlow:   func() *idem.Flow[orderReq] { return s.newFlow(m.bug) },
			Setup:     s.setupInput(m.card),
			Scope:     "tenant:acme",
			Compare:   idemtest.EqualJSON("order_id", "charge_id", "warehouse", "order_date"),
			Providers: []idemtest.FakeProvider{s.pay},
			Check:     s.check(m.emails),
		}
		if m.wire {
			cfg.DatabaseURL = s.url
		}
		wg.Go(func() { reps[i], errs[i] = idemtest.ExploreContext(t.Context(), cfg) })
	}
	wg.Wait()
	t.Logf("%d explorations side by side in %s", len(ms), time.Since(started).Round(time.Millisecond))

	var table strings.Builder
	fmt.Fprintf(&table, "%-62s | %-12s | %-9s | caught by (scenario: check)\n", "variant", "result", "kit time")
	for i, m := range ms {
		require.NoError(t, errs[i], m.title())
		rep := reps[i]
		fmt.Fprintf(&table, "%-62s | %-12s | %-9s | %s\n", m.title(), result(rep), rep.Elapsed.Round(10*time.Millisecond), caughtBy(rep))
		t.Logf("%s: %s", m.title(), rep.Summary())
	}
	t.Log("\n" + table.String())

	for i, m := range ms {
		rep := reps[i]
		t.Run(m.title(), func(t *testing.T) {
			if len(m.caughtBy) == 0 {
				require.NoError(t, rep.Err(), rep.Summary())
				if m.wire {
					require.Positive(t, rep.RoundTrips)
					kinds := map[idemtest.Kind]int{}
					for _, s := range rep.Scenarios {
						kinds[s.Kind]++
					}
					require.Equal(t, rep.RoundTrips, kinds[idemtest.StalledReply], "every stalled_reply scenario ran")
				}
				return
			}
			require.Error(t, rep.Err())
			if testing.Verbose() {
				t.Log(rep.Err())
			}
			for _, c := range m.caughtBy {
				s := failedScenario(rep, c.scenario)
				require.NotNil(t, s, "%s: scenario %s did not fail; failed: %s", m.title(), c.scenario, caughtBy(rep))
				require.Contains(t, strings.Join(s.Violations, "\n"), c.violation, s.String())
			}
		})
	}
}

func (m mutant) title() string {
	switch {
	case m.name != "":
		return m.name
	case m.bug == correct:
		return "correct"
	}
	return string(m.bug)
}

func result(rep *idemtest.Report) string {
	if len(rep.Failed()) == 0 {
		return "passed"
	}
	return fmt.Sprintf("%d failed", len(rep.Failed()))
}

func failedScenario(rep *idemtest.Report, name string) *idemtest.Scenario {
	for _, s := range rep.Failed() {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// caughtBy names the first failed scenarios and the checks that failed
// there.
func caughtBy(rep *idemtest.Report) string {
	failed := rep.Failed()
	if len(failed) == 0 {
		if n := len(rep.Scenarios); n > 0 {
			return fmt.Sprintf("(%d scenarios passed)", n+1)
		}
		return ""
	}
	var out []string
	for _, s := range failed[:min(2, len(failed))] {
		var checks []string
		for _, v := range s.Violations {
			if c := checkOf(v); !slices.Contains(checks, c) {
				checks = append(checks, c)
			}
		}
		out = append(out, s.Name+": "+strings.Join(checks, " + "))
	}
	if len(failed) > 2 {
		out = append(out, fmt.Sprintf("and %d more", len(failed)-2))
	}
	return strings.Join(out, "; ")
}

// checkOf names the check a violation comes from.
func checkOf(v string) string {
	switch {
	case strings.HasPrefix(v, "Check fails on the uninterrupted run"), strings.HasPrefix(v, "Check:"):
		return "Check (" + firstWords(v[strings.Index(v, ":")+2:], 5) + ")"
	case strings.Contains(v, "through a connection other than its transaction"):
		return "bypass check"
	case strings.Contains(v, "called Attempt.Foreign for"):
		return "refused foreign call"
	case strings.Contains(v, "does not deduplicate"):
		return "provider: effects per key"
	case strings.Contains(v, "different requests"):
		return "provider: requests per key"
	case strings.HasPrefix(v, "provider"), strings.Contains(v, "no provider received it"):
		return "provider: keys handed out"
	case strings.HasPrefix(v, "the final response"):
		return "Compare"
	}
	return firstWords(v, 6)
}

func firstWords(s string, n int) string {
	w := strings.Fields(s)
	if len(w) > n {
		w = append(w[:n], "...")
	}
	return strings.Join(w, " ")
}
