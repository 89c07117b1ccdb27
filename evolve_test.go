package idem_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/testfixture"
)

// A flow that changes between deploys, with keys left in flight by the old
// definition at every recovery point it has, and in the middle of its
// foreign call. Each phase writes a row naming itself; the charge goes to a
// provider that deduplicates on the downstream key.
type evolveInput struct {
	Amount float64 `json:"amount"`
}

type evolveBundle struct {
	*testBundle
	provider *testfixture.Provider
}

func setupEvolve(t *testing.T) *evolveBundle {
	t.Helper()
	b := setup(t)
	_, err := b.pool.Exec(context.Background(), `CREATE TABLE evolve_steps (key text NOT NULL, phase text NOT NULL)`)
	require.NoError(t, err)
	return &evolveBundle{testBundle: b, provider: &testfixture.Provider{}}
}

// step is a phase that records its own run.
func (b *evolveBundle) step(name string) idem.Phase[evolveInput] {
	return idem.Phase[evolveInput]{Name: name, Do: func(ctx context.Context, tx idem.Tx, a *idem.Attempt[evolveInput]) (idem.Result, error) {
		_, err := tx.Exec(ctx, `INSERT INTO evolve_steps VALUES ($1, $2)`, a.Key().Key, name)
		return idem.Advance(), err
	}}
}

// charge is a phase that charges through the provider and records the charge.
func (b *evolveBundle) charge(name string, former ...string) idem.Phase[evolveInput] {
	return idem.Phase[evolveInput]{Name: name, FormerNames: former, Do: func(ctx context.Context, tx idem.Tx, a *idem.Attempt[evolveInput]) (idem.Result, error) {
		var id string
		if err := a.Foreign(ctx, "charge", func(_ context.Context, key string) (err error) {
			id, err = b.provider.Charge(key, a.Input().Amount)
			return err
		}); err != nil {
			return idem.Result{}, err
		}
		_, err := tx.Exec(ctx, `INSERT INTO evolve_steps VALUES ($1, $2)`, a.Key().Key, name+":"+id)
		return idem.Advance(), err
	}}
}

// respond is a last phase.
func (b *evolveBundle) respond(name string) idem.Phase[evolveInput] {
	p := b.step(name)
	do := p.Do
	p.Do = func(ctx context.Context, tx idem.Tx, a *idem.Attempt[evolveInput]) (idem.Result, error) {
		if _, err := do(ctx, tx, a); err != nil {
			return idem.Result{}, err
		}
		return idem.RespondJSON(http.StatusCreated, map[string]string{"ok": name}), nil
	}
	return p
}

func (b *evolveBundle) flow(t *testing.T, phases []idem.Phase[evolveInput], cfg *idem.FlowConfig[evolveInput]) *idem.Flow[evolveInput] {
	t.Helper()
	f, err := idem.NewFlow("orders.create", phases, cfg)
	require.NoError(t, err)
	return f
}

// v1 is the definition every change starts from.
func (b *evolveBundle) v1(t *testing.T) *idem.Flow[evolveInput] {
	return b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), b.charge("charge"), b.step("notify"), b.respond("respond")}, nil)
}

// strand leaves key in flight under flow: it crashes at where in phase.
func (b *evolveBundle) strand(t *testing.T, flow *idem.Flow[evolveInput], key, phase string, where idemtest.HookWhere) {
	t.Helper()
	r := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{flow}, Test: idemtest.WithHook(idem.TestConfig{Now: b.clock.Now}, func(_ context.Context, at idemtest.HookPoint) error {
		if at.Phase == phase && at.Where == where {
			return idemtest.ErrSimulatedCrash
		}
		return nil
	})})
	_, err := r.Execute(context.Background(), flow, idem.Request{Scope: "s", Key: key, Method: "POST", Path: "/orders", Params: evolveInput{Amount: 10}})
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
}

// finish retries key under flow once the dead worker's lease is over.
func (b *evolveBundle) finish(t *testing.T, flow *idem.Flow[evolveInput], key string) (*idem.Outcome, error) {
	t.Helper()
	b.clock.Advance(idem.LeaseDefault + 1)
	r := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{flow}})
	return r.Execute(context.Background(), flow, idem.Request{Scope: "s", Key: key, Method: "POST", Path: "/orders", Params: evolveInput{Amount: 10}})
}

func (b *evolveBundle) steps(t *testing.T, key string) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT phase FROM evolve_steps WHERE key = $1 ORDER BY ctid`, key)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var p string
		require.NoError(t, rows.Scan(&p))
		out = append(out, p)
	}
	require.NoError(t, rows.Err())
	return out
}

// inFlight is where v1 leaves a key: at each recovery point (a crash as the
// next phase starts), and mid-call (the charge made, its phase not
// committed).
var inFlight = []struct {
	name  string
	phase string
	where idemtest.HookWhere
}{
	{"at started", "reserve", idemtest.HookPhaseStart},
	{"at reserve", "charge", idemtest.HookPhaseStart},
	{"mid-call", "charge", idemtest.HookAfterForeign},
	{"at charge", "notify", idemtest.HookPhaseStart},
	{"at notify", "respond", idemtest.HookPhaseStart},
}

// Each change a team makes to a flow, with keys in flight at every recovery
// point of the old definition: each finishes under the new one, every
// phase's work once, and one charge (the retry mid-call sends the same
// downstream key, also after a rename).
func TestFlowChangesResumeKeysInFlight(t *testing.T) {
	t.Parallel()
	changes := []struct {
		name string
		next func(b *evolveBundle, t *testing.T) *idem.Flow[evolveInput]
		// want is the evolve_steps rows of a key stranded at each inFlight
		// point once finished ("charge" stands for the charge row).
		want map[string][]string
	}{
		{
			// Renaming: the old name listed in FormerNames.
			name: "rename",
			next: func(b *evolveBundle, t *testing.T) *idem.Flow[evolveInput] {
				return b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), b.charge("charge_card", "charge"), b.step("notify"), b.respond("respond")}, nil)
			},
			want: map[string][]string{
				"at started": {"reserve", "charge_card", "notify", "respond"},
				"at reserve": {"reserve", "charge_card", "notify", "respond"},
				"mid-call":   {"reserve", "charge_card", "notify", "respond"},
				"at charge":  {"reserve", "charge", "notify", "respond"},
				"at notify":  {"reserve", "charge", "notify", "respond"},
			},
		},
		{
			// Inserting: keys before the new phase run it, keys past it
			// never do.
			name: "insert",
			next: func(b *evolveBundle, t *testing.T) *idem.Flow[evolveInput] {
				return b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), b.step("audit"), b.charge("charge"), b.step("notify"), b.respond("respond")}, nil)
			},
			want: map[string][]string{
				"at started": {"reserve", "audit", "charge", "notify", "respond"},
				"at reserve": {"reserve", "audit", "charge", "notify", "respond"},
				"mid-call":   {"reserve", "audit", "charge", "notify", "respond"},
				"at charge":  {"reserve", "charge", "notify", "respond"},
				"at notify":  {"reserve", "charge", "notify", "respond"},
			},
		},
		{
			// Removing: the removed phase retired to the phase before it.
			name: "remove",
			next: func(b *evolveBundle, t *testing.T) *idem.Flow[evolveInput] {
				return b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), b.charge("charge"), b.respond("respond")},
					&idem.FlowConfig[evolveInput]{RetiredPhases: map[string]string{"notify": "charge"}})
			},
			want: map[string][]string{
				"at started": {"reserve", "charge", "respond"},
				"at reserve": {"reserve", "charge", "respond"},
				"mid-call":   {"reserve", "charge", "respond"},
				"at charge":  {"reserve", "charge", "respond"},
				"at notify":  {"reserve", "charge", "notify", "respond"},
			},
		},
		{
			// Appending: the old last phase now advances, and every key in
			// flight runs the new last one.
			name: "append",
			next: func(b *evolveBundle, t *testing.T) *idem.Flow[evolveInput] {
				return b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), b.charge("charge"), b.step("notify"), b.step("respond"), b.respond("archive")}, nil)
			},
			want: map[string][]string{
				"at started": {"reserve", "charge", "notify", "respond", "archive"},
				"at reserve": {"reserve", "charge", "notify", "respond", "archive"},
				"mid-call":   {"reserve", "charge", "notify", "respond", "archive"},
				"at charge":  {"reserve", "charge", "notify", "respond", "archive"},
				"at notify":  {"reserve", "charge", "notify", "respond", "archive"},
			},
		},
	}
	for _, change := range changes {
		t.Run(change.name, func(t *testing.T) {
			t.Parallel()
			b := setupEvolve(t)
			old := b.v1(t)
			for _, at := range inFlight {
				b.strand(t, old, at.name, at.phase, at.where)
			}
			next := change.next(b, t)
			for _, at := range inFlight {
				out, err := b.finish(t, next, at.name)
				require.NoError(t, err, at.name)
				require.Equal(t, http.StatusCreated, out.Response.Status, at.name)
				got := b.steps(t, at.name)
				for i, s := range got { // the charge row carries the charge id
					got[i], _, _ = strings.Cut(s, ":")
				}
				require.Equal(t, change.want[at.name], got, at.name)
			}
			// One charge per key: the mid-call key's retry sent the downstream
			// key of the first try, whatever the phase is called now.
			require.Equal(t, len(inFlight), b.provider.Charges())
		})
	}
}

// Without the declarations the same changes strand the keys, as before.
func TestUndeclaredFlowChangesStrandKeys(t *testing.T) {
	t.Parallel()
	b := setupEvolve(t)
	old := b.v1(t)
	b.strand(t, old, "k", "notify", idemtest.HookPhaseStart) // at charge
	renamed := b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), b.charge("charge_card"), b.step("notify"), b.respond("respond")}, nil)
	_, err := b.finish(t, renamed, "k")
	require.ErrorIs(t, err, idem.ErrUnknownRecoveryPoint)
}

// NewFlow checks former and retired names.
func TestFormerAndRetiredNamesAreChecked(t *testing.T) {
	t.Parallel()
	b := &evolveBundle{testBundle: &testBundle{}, provider: &testfixture.Provider{}}
	for name, tc := range map[string]struct {
		phases []idem.Phase[evolveInput]
		cfg    *idem.FlowConfig[evolveInput]
		want   string
	}{
		"former is a current name": {[]idem.Phase[evolveInput]{b.step("a"), b.charge("b", "a"), b.respond("c")}, nil, `"a" is already a name or former name of phase "a"`},
		"former twice":             {[]idem.Phase[evolveInput]{b.charge("a", "x"), b.charge("b", "x"), b.respond("c")}, nil, `"x" is already a name or former name of phase "a"`},
		"former reserved":          {[]idem.Phase[evolveInput]{b.charge("a", "started"), b.respond("c")}, nil, "reserved"},
		"former malformed":         {[]idem.Phase[evolveInput]{b.charge("a", "Old-Name"), b.respond("c")}, nil, "lowercase"},
		"retired is current":       {[]idem.Phase[evolveInput]{b.step("a"), b.respond("c")}, &idem.FlowConfig[evolveInput]{RetiredPhases: map[string]string{"a": "started"}}, "already a name"},
		"retired to nowhere":       {[]idem.Phase[evolveInput]{b.step("a"), b.respond("c")}, &idem.FlowConfig[evolveInput]{RetiredPhases: map[string]string{"x": "y"}}, `stands for "y"`},
		// Whatever the map's order: a retired phase never stands for another.
		"retired chain":   {[]idem.Phase[evolveInput]{b.step("a"), b.respond("c")}, &idem.FlowConfig[evolveInput]{RetiredPhases: map[string]string{"x": "y", "y": "a"}}, `retired phase "x" stands for "y"`},
		"retired to last": {[]idem.Phase[evolveInput]{b.step("a"), b.respond("c")}, &idem.FlowConfig[evolveInput]{RetiredPhases: map[string]string{"x": "c"}}, "the last phase"},
	} {
		_, err := idem.NewFlow("f", tc.phases, tc.cfg)
		require.ErrorContains(t, err, tc.want, name)
	}
	// A retired phase may stand for a former name, or for the start.
	_, err := idem.NewFlow("f", []idem.Phase[evolveInput]{b.charge("a", "old_a"), b.respond("c")},
		&idem.FlowConfig[evolveInput]{RetiredPhases: map[string]string{"x": "old_a", "y": idemtype.RecoveryPointStarted}})
	require.NoError(t, err)
}

// CheckFlowChange passes each declared change of TestFlowChangesResumeKeysInFlight
// and reports each undeclared or unsafe one.
func TestCheckFlowChange(t *testing.T) {
	t.Parallel()
	b := &evolveBundle{testBundle: &testBundle{}, provider: &testfixture.Provider{}}
	v1 := b.v1(t)
	sms := func(name string, former ...string) idem.Phase[evolveInput] {
		p := b.charge(name, former...)
		p.Foreign = idem.ForeignNotIdempotent
		p.Reconcile = func(context.Context, idem.Tx, *idem.Attempt[evolveInput]) (idem.ReconcileVerdict, error) {
			return idem.ReconcileVerdict{}, nil
		}
		return p
	}
	withSMS := b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), sms("send"), b.respond("respond")}, nil)
	for name, tc := range map[string]struct {
		prev, next *idem.Flow[evolveInput]
		want       []string // empty: safe
	}{
		"same":            {v1, b.v1(t), nil},
		"rename declared": {v1, b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), b.charge("charge_card", "charge"), b.step("notify"), b.respond("respond")}, nil), nil},
		"insert":          {v1, b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), b.step("audit"), b.charge("charge"), b.step("notify"), b.respond("respond")}, nil), nil},
		"append":          {v1, b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), b.charge("charge"), b.step("notify"), b.step("respond"), b.respond("archive")}, nil), nil},
		"remove declared": {v1, b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), b.charge("charge"), b.respond("respond")},
			&idem.FlowConfig[evolveInput]{RetiredPhases: map[string]string{"notify": "charge"}}), nil},
		"rename undeclared": {v1, b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), b.charge("charge_card"), b.step("notify"), b.respond("respond")}, nil),
			[]string{`a key at "charge" cannot resume`}},
		"remove undeclared": {v1, b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), b.charge("charge"), b.respond("respond")}, nil),
			[]string{`a key at "notify" cannot resume`}},
		"renamed twice, oldest name dropped": {
			b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), b.charge("charge_card", "charge"), b.respond("respond")}, nil),
			b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), b.charge("bill", "charge_card"), b.respond("respond")}, nil),
			[]string{`a key at "charge" cannot resume`, `would send other downstream keys (derived from "charge_card", was "charge")`}},
		"last phase removed": {v1, b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), b.charge("charge"), b.respond("notify")}, nil),
			[]string{`a key at "notify" would have no phase left to run`}},
		"not-idempotent removed": {withSMS, b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), b.respond("respond")},
			&idem.FlowConfig[evolveInput]{RetiredPhases: map[string]string{"send": "reserve"}}),
			[]string{`a key in doubt marked at "send" could not be settled`}},
		"not-idempotent made idempotent": {withSMS, b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), b.charge("send"), b.respond("respond")}, nil),
			[]string{`a key in doubt marked at "send" could not be settled`}},
		"not-idempotent made idempotent, hook kept": {withSMS, b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), func() idem.Phase[evolveInput] {
			p := sms("send")
			p.Foreign = idem.ForeignIdempotent
			return p
		}(), b.respond("respond")}, nil), nil},
		"former name of a not-idempotent phase dropped": {
			b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), sms("send", "sms"), b.respond("respond")}, nil),
			b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), sms("send"), b.respond("respond")}, nil),
			[]string{`a key in doubt marked at "sms" could not be settled`, `would send other downstream keys`}},
		"reordered": {v1, b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), b.step("notify"), b.charge("charge"), b.respond("respond")}, nil),
			[]string{`a key at "charge" has yet to run "notify", which the next definition would skip`,
				`a key at "notify" has committed "charge", which the next definition would run again`}},
		"retired to the wrong phase": {v1, b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), b.charge("charge"), b.respond("respond")},
			&idem.FlowConfig[evolveInput]{RetiredPhases: map[string]string{"notify": "reserve"}}),
			[]string{`a key at "notify" has committed "charge", which the next definition would run again`}},
		"renamed flow": {v1, func() *idem.Flow[evolveInput] {
			f, err := idem.NewFlow("orders.create.v2", []idem.Phase[evolveInput]{b.respond("respond")}, nil)
			require.NoError(t, err)
			return f
		}(), []string{`keys belong to a flow by its name`}},
	} {
		err := idem.CheckFlowChange(tc.prev, tc.next)
		if len(tc.want) == 0 {
			require.NoError(t, err, name)
			continue
		}
		require.ErrorIs(t, err, idem.ErrUnsafeFlowChange, name)
		for _, w := range tc.want {
			require.ErrorContains(t, err, w, name)
		}
	}
}

// CheckResumable finds the keys an undeclared change stranded, and nothing
// once the change is declared.
func TestCheckResumableReportsStrandedKeys(t *testing.T) {
	t.Parallel()
	b := setupEvolve(t)
	old := b.v1(t)
	b.strand(t, old, "a", "notify", idemtest.HookPhaseStart) // at charge
	b.strand(t, old, "b", "notify", idemtest.HookPhaseStart) // at charge
	b.strand(t, old, "c", "charge", idemtest.HookPhaseStart) // at reserve

	undeclared := b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), b.charge("charge_card"), b.step("notify"), b.respond("respond")}, nil)
	var events []idem.Event
	r := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{undeclared}, Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) {
		if e.Kind == idem.EventUnresumable {
			events = append(events, e)
		}
	})})
	rep, err := r.CheckResumable(context.Background())
	require.NoError(t, err)
	require.Equal(t, []idem.RecoveryPointKeys{{Flow: "orders.create", RecoveryPoint: "charge", Keys: 2}}, rep.Unresumable)
	require.Empty(t, rep.Declared)
	require.Len(t, events, 1)
	require.Equal(t, "charge", events[0].Phase)
	require.Equal(t, 2, events[0].Count)

	// Declared, the keys resume, and the report says the declaration is
	// still needed.
	declared := b.flow(t, []idem.Phase[evolveInput]{b.step("reserve"), b.charge("charge_card", "charge"), b.step("notify"), b.respond("respond")}, nil)
	dr := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{declared}})
	rep, err = dr.CheckResumable(context.Background())
	require.NoError(t, err)
	require.Empty(t, rep.Unresumable)
	require.Equal(t, []idem.RecoveryPointKeys{{Flow: "orders.create", RecoveryPoint: "charge", Keys: 2}}, rep.Declared)

	// Once those keys finish, nothing needs it.
	for _, k := range []string{"a", "b"} {
		_, err := b.finish(t, declared, k)
		require.NoError(t, err)
	}
	rep, err = dr.CheckResumable(context.Background())
	require.NoError(t, err)
	require.Empty(t, rep.Unresumable)
	require.Empty(t, rep.Declared)
}
