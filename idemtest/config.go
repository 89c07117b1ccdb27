package idemtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/hooks"
	"github.com/go-idem/idem/pgstore"
)

// Config says what to explore. Flow, Input and a store (Store, or Pool) are
// required; everything else has a default.
type Config[In any] struct {
	// Flow is the flow under test. Set it or NewFlow.
	Flow *idem.Flow[In]

	// NewFlow, instead of Flow, builds the flow under test afresh for every
	// worker the kit starts: every simulated process has flow values of its
	// own, as after a real crash, so state a phase keeps in memory for a
	// later one (a map, a field of the struct its phases close over) does
	// not survive a crash into the retry. Each call must return the same
	// definition. With Flow, every worker shares one value and such state
	// survives, invisible to the kit.
	NewFlow func() *idem.Flow[In]

	// Input is the request every scenario sends. It decides the path through
	// the flow, and so which crash points exist: explore each path that
	// matters (a success, a decline) with an Input that takes it.
	Input In

	// Setup, when set, replaces Input: the kit calls it before each
	// scenario (and each baseline) with the scenario's idempotency key, and
	// the scenario sends the input it returns. Give each scenario rows of
	// its own there (a product with its own stock, an account with its own
	// balance), so that an invariant over them holds per scenario: a Check
	// finds the scenario's rows again from KeyRecord.Key, and one broken
	// scenario does not make every later Check fail. Every input must take
	// the same path through the flow. Setup must be safe for concurrent use
	// (wire scenarios run side by side).
	Setup func(ctx context.Context, key string) (In, error)

	// Pool reaches the database holding idem's tables (migrated) and the
	// flow's own. It may be left nil when Store is a *pgstore.Store, whose
	// pool is then used. Give it at least four connections: the takeover
	// scenario holds one open for its paused worker while another works.
	Pool *pgxpool.Pool

	// Schema is where idem's tables live; see pgstore.Config.Schema.
	Schema string

	// Store is the store the kit's runners use; nil makes a pgstore.Store
	// on Pool and Schema. Set it to run on a store of your own (a wrapper
	// that adds metrics, say). The paused worker of the takeover scenario
	// always runs on a pgstore.Store the kit makes on Pool and Schema,
	// because the kit must see which connection it holds.
	Store idemdriver.Store

	// Runner is the base configuration of every runner the kit makes: your
	// Lease, Isolation, MaxPhaseRetries, Observer and so on. The kit adds
	// Flow to Flows, replaces Test.Now with its own clock, calls your
	// hook (WithHook) before its own, sends every event to your Observer after
	// recording it, and discards logs unless Logger is set. Nil means the
	// defaults.
	Runner *idem.Config

	// Scope is the scope of every key the kit uses. Default "idemtest".
	Scope string

	// Path is the route recorded on the keys, and bound to them like the
	// flow and the input. Optional.
	Path string

	// Compare decides whether a scenario's final response is the one the
	// uninterrupted run gave. Default EqualStatusAndBody; use EqualJSON to
	// ignore generated ids.
	Compare Comparator

	// Check, when set, runs after every scenario (and after the baseline)
	// on the scenario's finished key. Put business invariants here: exactly
	// one ride row and one ledger charge for this key. It is the only way
	// the kit sees your tables and your providers, so it is what catches
	// writes made outside the phase's transaction and foreign calls made
	// outside Attempt.Foreign.
	Check func(ctx context.Context, key *idemtype.KeyRecord) error

	// Providers are the fake providers the flow can reach, every one of
	// them: *Provider, or a fake of your own with a Calls method (see
	// FakeProvider). The kit checks that every call they received during
	// a scenario carried a downstream key the runner handed out in that
	// scenario, that every such key reached one of them, and, per key, one
	// subject and at most one effect. A provider left out is invisible: a
	// call to it outside Attempt.Foreign passes unless Check counts it.
	// Give each exploration providers of its own.
	Providers []FakeProvider

	// Bypass configures the check for writes that bypass the phase's
	// transaction, made in every crash_before_commit scenario, and in
	// serialization_failure and lease_takeover at a phase a new key is
	// acquired with (see BypassCheck). The zero value watches every table on Pool's
	// search_path but idem's own.
	Bypass BypassCheck

	// Kinds limits the scenario kinds explored. Default AllKinds().
	Kinds []Kind

	// PreviousFlow is the definition of Flow that the running release has,
	// when Flow changes it (a phase renamed, inserted, removed, appended).
	// The kit then checks the change before it ships: idem.CheckFlowChange
	// (a scenario "flow change"), and an upgrade scenario for each crash
	// kind (CrashBeforeCommit, CrashAfterForeign, CrashAfterCommit) at each
	// phase of PreviousFlow: the first attempt runs the previous definition
	// and dies there, and every retry runs Flow, which must finish the key
	// with the uninterrupted run's response and every effect once. Nil: no
	// upgrade check. It must have Flow's name.
	PreviousFlow *idem.Flow[In]

	// MaxAttempts bounds the retries a scenario makes after its fault before
	// it is declared stuck. Default 10.
	MaxAttempts int

	// DatabaseURL turns on the wire scenarios (LostReply, StalledReply),
	// which break the request's round trips to Postgres themselves through
	// a FaultProxy. It is a postgres:// URL of the database Pool reaches,
	// naming one TCP host, with what its connections need to find the
	// flow's tables (a search_path parameter, say). The kit puts a proxy in
	// front of it for every wire scenario and runs the faulted request on a
	// pgstore.Store of its own (on Schema) over a small pool through the
	// proxy; everything else still goes through Store. Empty: no wire
	// scenarios.
	DatabaseURL string

	// WireParallelism is how many wire scenarios run at once. Default 8;
	// 1 runs them one at a time. Scenarios running side by side share your
	// tables: a stalled one holds the row locks its transaction took until
	// its worker answers, so a flow that updates one shared row (a stock,
	// a balance, a counter) makes the others wait on it past WireTimeout.
	// The kit runs a wire scenario that failed beside others once more,
	// alone, and holds it to that run (Scenario.RanAlone), so such waits
	// never fail a correct flow; a lower setting only saves those re-runs.
	WireParallelism int

	// WireTimeout is the StatementTimeout and PhaseStatementTimeout of the
	// runners whose requests go through the proxy: a request whose reply is
	// stalled must answer within 10 times it. Raise it if a phase's
	// statements legitimately take longer. Default 2s, enough for a loaded CI
	// machine running the race detector.
	WireTimeout time.Duration
}

// Comparator reports how got, a scenario's final response, differs from
// baseline, the uninterrupted run's; nil means they are the same.
type Comparator func(baseline, got *idemtype.Response) error

// Kind is a kind of fault the kit injects. Each kind applies at one point
// of a phase; a scenario is a kind at one phase, named "kind@phase".
type Kind string

const (
	// CrashBeforeCommit: the worker dies after the phase did all its work
	// (including its foreign call), right before the commit. Its
	// transaction rolls back and its lease is left to expire.
	CrashBeforeCommit Kind = "crash_before_commit"

	// CrashAfterForeign: the worker dies right after the phase's foreign
	// call returned: the effect happened, the phase did not commit.
	CrashAfterForeign Kind = "crash_after_foreign"

	// CrashAfterCommit: the worker dies right after the phase committed,
	// before it could go on or answer. When the commit left the request
	// unfinished, its client comes back a day later (lateRetry), so the
	// rest of the request runs at another time, on another date: a phase
	// that reads the clock again (Attempt.Now) for something an earlier
	// phase decided shows.
	CrashAfterCommit Kind = "crash_after_commit"

	// LostCommitAck: the commit succeeds but the worker sees an error, as
	// when the connection drops before the acknowledgement arrives. The
	// runner reports the store unavailable and lets go of the key.
	LostCommitAck Kind = "lost_commit_ack"

	// SerializationFailure: the phase fails with SQLSTATE 40001 just before
	// committing, once. The runner retries the phase (or, after a
	// not-idempotent call, sends the key to reconciliation).
	SerializationFailure Kind = "serialization_failure"

	// LeaseTakeover: the worker pauses just before the phase commits, with
	// its transaction open, until its lease expires; a second worker takes
	// the key over and finishes the request; then the first resumes. It
	// must end with idem.ErrLockLost, its writes rolled back.
	LeaseTakeover Kind = "lease_takeover"

	// LostReply (a wire scenario, which needs Config.DatabaseURL): the
	// reply to one round trip of the request is lost on its way from
	// Postgres, which ran the command; the worker's connection is reset.
	// One scenario per round trip the request makes.
	LostReply Kind = "lost_reply"

	// StalledReply (a wire scenario, which needs Config.DatabaseURL): the
	// network stalls as the reply to one round trip comes back, after
	// Postgres ran the command, and stays stalled until the worker has
	// answered, which its statement timeouts must make it do. One scenario
	// per round trip the request makes.
	StalledReply Kind = "stalled_reply"
)

// AllKinds returns every scenario kind: those injected at each phase, in
// the order the kit runs them there, then the wire kinds, which run only
// when Config.DatabaseURL is set (and are left out of the default Kinds
// otherwise).
func AllKinds() []Kind {
	return []Kind{CrashBeforeCommit, CrashAfterForeign, CrashAfterCommit, LostCommitAck, SerializationFailure, LeaseTakeover, LostReply, StalledReply}
}

// Wire reports whether k is a wire kind: a fault on the network between
// the worker and Postgres, injected by a FaultProxy at one round trip,
// rather than through the runner's hooks at one phase.
func (k Kind) Wire() bool { return k == LostReply || k == StalledReply }

// where is the hook point at which the kind's fault is injected.
func (k Kind) where() HookWhere {
	switch k {
	case CrashAfterForeign:
		return HookAfterForeign
	case CrashAfterCommit, LostCommitAck:
		return HookAfterCommit
	}
	return HookBeforeCommit
}

// describe says in a sentence what the scenario does at phase.
func (k Kind) describe(phase, foreign string) string {
	switch k {
	case CrashBeforeCommit:
		return fmt.Sprintf("the worker dies after phase %q did its work, right before its commit", phase)
	case CrashAfterForeign:
		return fmt.Sprintf("the worker dies right after the foreign call %q of phase %q returned, before the phase commits", foreign, phase)
	case CrashAfterCommit:
		return fmt.Sprintf("the worker dies right after phase %q committed", phase)
	case LostCommitAck:
		return fmt.Sprintf("phase %q commits but the worker sees the commit fail (a lost acknowledgement)", phase)
	case SerializationFailure:
		return fmt.Sprintf("phase %q hits a serialization failure (SQLSTATE 40001) just before committing", phase)
	case LeaseTakeover:
		return fmt.Sprintf("the worker pauses just before phase %q commits until its lease expires; a second worker takes the key over and finishes; then the first resumes", phase)
	}
	return string(k)
}

func (k Kind) valid() bool {
	for _, known := range AllKinds() {
		if k == known {
			return true
		}
	}
	return false
}

// ErrInvalidConfig is wrapped by the error Run returns when the Config is
// unusable.
var ErrInvalidConfig = errors.New("idemtest: invalid config")

const (
	defaultScope       = "idemtest"
	defaultMaxAttempts = 10
	defaultWireTimeout = 2 * time.Second
	// defaultWireParallelism: each wire scenario has its own proxy, pools
	// and key; a stalled one mostly waits.
	defaultWireParallelism = 8
)

// withDefaults checks c and returns a copy with defaults filled in, the
// store to use and the database handle for lock-wait queries.
func (c Config[In]) withDefaults() (Config[In], idemdriver.Store, pgstore.DB, error) {
	fail := func(format string, args ...any) (Config[In], idemdriver.Store, pgstore.DB, error) {
		return c, nil, nil, fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Flow != nil && c.NewFlow != nil:
		return fail("set Flow or NewFlow, not both")
	case c.NewFlow != nil:
		if c.Flow = c.NewFlow(); c.Flow == nil {
			return fail("NewFlow returned nil")
		}
	case c.Flow == nil:
		return fail("Flow is nil")
	}
	if c.PreviousFlow != nil && c.PreviousFlow.Name() != c.Flow.Name() {
		return fail("PreviousFlow is flow %q, not %q: keys belong to a flow by its name", c.PreviousFlow.Name(), c.Flow.Name())
	}
	if c.Scope == "" {
		c.Scope = defaultScope
	}
	if len(c.Scope) > 255 {
		return fail("Scope is longer than 255 bytes")
	}
	if c.Compare == nil {
		c.Compare = EqualStatusAndBody
	}
	if len(c.Kinds) == 0 {
		for _, k := range AllKinds() {
			if !k.Wire() || c.DatabaseURL != "" {
				c.Kinds = append(c.Kinds, k)
			}
		}
	}
	for _, k := range c.Kinds {
		if !k.valid() {
			return fail("unknown scenario kind %q", k)
		}
		if k.Wire() && c.DatabaseURL == "" {
			return fail("the wire scenario kind %q needs DatabaseURL", k)
		}
	}
	if c.DatabaseURL != "" {
		if !strings.Contains(c.DatabaseURL, "://") {
			return fail("DatabaseURL is not a postgres:// URL")
		}
		if _, err := proxyTarget(c.DatabaseURL); err != nil {
			return fail("DatabaseURL: %v", err)
		}
	}
	if c.WireParallelism == 0 {
		c.WireParallelism = defaultWireParallelism
	}
	if c.WireParallelism < 0 {
		return fail("WireParallelism is negative")
	}
	if c.WireTimeout == 0 {
		c.WireTimeout = defaultWireTimeout
	}
	if c.WireTimeout < 0 {
		return fail("WireTimeout is negative")
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = defaultMaxAttempts
	}
	if c.MaxAttempts < 0 {
		return fail("MaxAttempts is negative")
	}
	for i, p := range c.Providers {
		if p == nil {
			return fail("Providers[%d] is nil", i)
		}
	}

	store := c.Store
	if store == nil {
		if c.Pool == nil {
			return fail("set Store, or Pool to reach the database")
		}
		// The kit's runs are short: the store shares the pool for its
		// control statements rather than opening a pool of its own. Size the
		// pool for it (see minTakeoverConns).
		s, err := pgstore.New(c.Pool, &pgstore.Config{Schema: c.Schema, ControlDB: c.Pool})
		if err != nil {
			return fail("%v", err)
		}
		store = s
	}
	var db pgstore.DB
	switch {
	case c.Pool != nil:
		db = c.Pool
	default:
		withDB, ok := store.(interface{ DB() pgstore.DB })
		if !ok {
			return fail("Store %T has no DB method; set Pool too", store)
		}
		db = withDB.DB()
	}
	// The takeover scenario's paused worker runs on a pgstore.Store the kit
	// makes on db and Schema; it must find the same table as Store.
	own, err := pgstore.New(db, &pgstore.Config{Schema: c.Schema, ControlDB: db})
	if err != nil {
		return fail("%v", err)
	}
	ownTable, _ := hooks.StoreTable(own)
	if table, ok := hooks.StoreTable(store); ok && table != ownTable {
		return fail("Schema %q gives table %s, but Store uses %s; set Schema to the Store's", c.Schema, ownTable, table)
	}
	if pool, ok := db.(*pgxpool.Pool); ok && slices.Contains(c.Kinds, LeaseTakeover) && pool.Config().MaxConns < minTakeoverConns {
		return fail("the pool allows %d connections; the lease takeover scenario needs %d: the paused worker's transaction, the second worker's transaction and statements, and the kit's lock-wait query", pool.Config().MaxConns, minTakeoverConns)
	}
	return c, store, db, nil
}

// minTakeoverConns is how many connections the takeover scenario may hold at
// once.
const minTakeoverConns = 4
