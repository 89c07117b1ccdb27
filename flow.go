package idem

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"time"

	"github.com/go-idem/idem/idemtype"
	"github.com/jackc/pgx/v5"
)

// Flow is an endpoint's declaration: a name and the ordered phases a request
// goes through. In is the decoded input every phase sees through
// [Attempt.Input]; it must survive a JSON round trip, because the runner
// stores it (or what FlowConfig.Store keeps of it) as JSON to re-drive
// requests whose clients gave up. The fingerprint that binds a key to its
// request is taken over what the client sent (Request.Payload), not over In, so In may
// change between releases: stored inputs are decoded into the In of the
// running release tolerantly (a field added since gets its zero value, a
// member removed is ignored).
type Flow[In any] struct {
	name   string
	phases []Phase[In]
	names  []string
	// index finds a phase by its name or a former name.
	index map[string]int
	// retired maps a removed phase's name to the index of the phase a key
	// recorded at it resumes with (FlowConfig.RetiredPhases).
	retired   map[string]int
	retention time.Duration
	abandon   time.Duration
	store     func(In) In
	noRedrive bool
}

// FlowConfig holds a flow's optional settings.
type FlowConfig[In any] struct {
	// Retention is how long a finished key of this flow is replayed before
	// the reaper may delete it. Zero uses Config.Retention (default 24h).
	Retention time.Duration

	// UnfinishedRetention is how long after its creation an unfinished key
	// of this flow is kept (see Config.UnfinishedRetention). Zero uses
	// Config.UnfinishedRetention (default 7 days); negative keeps this flow's
	// unfinished keys forever. It applies to flows registered in
	// Config.Flows, which is how the reaper knows them.
	UnfinishedRetention time.Duration

	// Store says what of a request's input is stored with its key (the
	// params column), for a completer or a reconcile run to re-drive the
	// request without its client: the input it returns is stored instead
	// of the whole one. Return a copy with the fields that must not be
	// kept (a card number, a password, a document) zeroed or replaced
	// (the last four digits). The fingerprint is still taken over the whole
	// payload, so a retry with other values in those fields is a mismatch,
	// and the phases of a client's request (first attempt or retry) still
	// see the whole input; only phases resumed server-side (the completer,
	// reconcile runs) see what Store kept. Nil stores the whole input.
	Store func(in In) In

	// NoRedrive says that what Store keeps cannot re-drive the flow: its
	// phases need what it drops. The completer then never picks up this
	// flow's keys; an unfinished key waits for its client's retry, which
	// brings the whole input, or is deleted (UnfinishedRetention). A reconcile
	// run still settles a phase in doubt (its hook sees the stored input),
	// then leaves the key for the client's retry instead of running later
	// phases, and says so with ErrNoRedrive.
	NoRedrive bool

	// RetiredPhases lists the phases a deploy removed from the flow, each
	// with the recovery point a key recorded at it now stands for: the name
	// of a current phase, whose successor the key resumes with, or
	// RecoveryPointStarted, to resume with the first phase. A key that
	// committed a removed phase has done its work; map it to the phase that
	// came before it in the old definition, so the key carries on with what
	// followed. Without an entry such keys fail with ErrUnknownRecoveryPoint.
	// A retired name cannot settle a call in doubt: a not-idempotent phase is
	// removed only once no key is marked at it (Runner.CheckResumable).
	RetiredPhases map[string]string
}

var (
	flowNamePattern  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$`)
	phaseNamePattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)
)

// NewFlow declares a flow. It checks the declaration: a valid unique name per
// phase, a Do function on each, a Reconcile hook on every not-idempotent
// phase, and Phase.JoinPrevious only where a shared commit is safe. Flow
// names are stored with each key, so a name must keep meaning the same
// endpoint across deploys.
func NewFlow[In any](name string, phases []Phase[In], config *FlowConfig[In]) (*Flow[In], error) {
	if !flowNamePattern.MatchString(name) {
		return nil, fmt.Errorf("idem: flow name %q: use 1-128 letters, digits and _.:/- starting with a letter or digit", name)
	}
	if len(phases) == 0 {
		return nil, fmt.Errorf("idem: flow %q has no phases", name)
	}
	if config == nil {
		config = &FlowConfig[In]{}
	}
	if config.Retention < 0 {
		return nil, fmt.Errorf("idem: flow %q: negative retention", name)
	}
	f := &Flow[In]{name: name, phases: append([]Phase[In](nil), phases...), index: map[string]int{}, retired: map[string]int{},
		retention: config.Retention, abandon: config.UnfinishedRetention, store: config.Store, noRedrive: config.NoRedrive}
	for i, p := range f.phases {
		switch {
		case !phaseNamePattern.MatchString(p.Name):
			return nil, fmt.Errorf("idem: flow %q phase %d: name %q: use lowercase letters, digits and _ starting with a letter, at most 64", name, i, p.Name)
		case p.Name == idemtype.RecoveryPointStarted || p.Name == idemtype.RecoveryPointFinished:
			return nil, fmt.Errorf("idem: flow %q: %q is a reserved recovery point, not a phase name", name, p.Name)
		case p.Do == nil:
			return nil, fmt.Errorf("idem: flow %q phase %q has no Do function", name, p.Name)
		case p.Foreign == ForeignNotIdempotent && p.Reconcile == nil:
			return nil, fmt.Errorf("idem: flow %q phase %q makes a not-idempotent foreign call and needs a Reconcile hook", name, p.Name)
		case p.Foreign != ForeignIdempotent && p.Foreign != ForeignNotIdempotent:
			return nil, fmt.Errorf("idem: flow %q phase %q: unknown foreign kind %d", name, p.Name, p.Foreign)
		}
		if err := checkJoin(name, phases, i); err != nil {
			return nil, err
		}
		if _, dup := f.index[p.Name]; dup {
			return nil, fmt.Errorf("idem: flow %q has two phases named %q", name, p.Name)
		}
		f.index[p.Name] = i
		f.names = append(f.names, p.Name)
	}
	// Former names after every current name, so a former name that is
	// some phase's current name is reported as such.
	for i, p := range f.phases {
		for _, former := range p.FormerNames {
			if err := f.checkNewName(former); err != nil {
				return nil, fmt.Errorf("idem: flow %q phase %q: former name: %w", name, p.Name, err)
			}
			f.index[former] = i
		}
	}
	// Retired phases stand for a phase (or its former name) or the start,
	// never for another retired phase: each resolves on its own, whatever
	// the map's order.
	for _, retired := range slices.Sorted(maps.Keys(config.RetiredPhases)) {
		point := config.RetiredPhases[retired]
		if err := f.checkNewName(retired); err != nil {
			return nil, fmt.Errorf("idem: flow %q: retired phase: %w", name, err)
		}
		next, ok := 0, point == idemtype.RecoveryPointStarted
		if i, known := f.index[point]; known {
			next, ok = i+1, true
		}
		switch {
		case !ok:
			return nil, fmt.Errorf("idem: flow %q: retired phase %q stands for %q, which is neither %q nor a phase of the flow", name, retired, point, idemtype.RecoveryPointStarted)
		case next >= len(f.phases):
			return nil, fmt.Errorf("idem: flow %q: retired phase %q stands for %q, the last phase: nothing would be left to run", name, retired, point)
		}
		f.retired[retired] = next
	}
	return f, nil
}

// checkNewName checks a former or retired phase name: a valid name no other
// phase, former name or retired phase of the flow uses.
func (f *Flow[In]) checkNewName(n string) error {
	switch _, taken := f.index[n]; {
	case !phaseNamePattern.MatchString(n):
		return fmt.Errorf("name %q: use lowercase letters, digits and _ starting with a letter, at most 64", n)
	case n == idemtype.RecoveryPointStarted || n == idemtype.RecoveryPointFinished:
		return fmt.Errorf("%q is a reserved recovery point", n)
	case taken:
		return fmt.Errorf("%q is already a name or former name of phase %q", n, f.names[f.index[n]])
	}
	if _, taken := f.retired[n]; taken {
		return fmt.Errorf("%q is already a retired phase", n)
	}
	return nil
}

// checkJoin checks phase i's Phase.JoinPrevious against its neighbours.
func checkJoin[In any](flow string, phases []Phase[In], i int) error {
	p := phases[i]
	if !p.JoinPrevious {
		return nil
	}
	if i == 0 {
		return fmt.Errorf("idem: flow %q phase %q: the first phase has no phase before it to join", flow, p.Name)
	}
	prev := phases[i-1]
	first := joinHead(phases, i)
	switch {
	case p.Foreign == ForeignNotIdempotent:
		return fmt.Errorf("idem: flow %q phase %q makes a not-idempotent foreign call, so it commits alone and cannot join %q", flow, p.Name, prev.Name)
	case prev.Foreign == ForeignNotIdempotent:
		return fmt.Errorf("idem: flow %q phase %q cannot join %q, which makes a not-idempotent foreign call and commits alone", flow, p.Name, prev.Name)
	case p.Isolation != "" && p.Isolation != phases[first].Isolation:
		return fmt.Errorf("idem: flow %q phase %q joins the transaction of %q, whose isolation level it cannot change (%q)", flow, p.Name, phases[first].Name, p.Isolation)
	}
	return nil
}

// joinHead is the index of the first phase of the transaction phase i runs
// in: i itself, or the phase its chain of Phase.JoinPrevious starts at.
func joinHead[In any](phases []Phase[In], i int) int {
	for i > 0 && phases[i].JoinPrevious {
		i--
	}
	return i
}

// MustNewFlow is NewFlow for package-level declarations; it panics on an
// invalid declaration, which is a programming error.
func MustNewFlow[In any](name string, phases []Phase[In], config *FlowConfig[In]) *Flow[In] {
	f, err := NewFlow(name, phases, config)
	if err != nil {
		panic(err)
	}
	return f
}

// Name returns the flow's name.
func (f *Flow[In]) Name() string { return f.name }

// PhaseNames returns the phase names in order.
func (f *Flow[In]) PhaseNames() []string { return append([]string(nil), f.names...) }

// AnyFlow is a [Flow] of any input type. The runner, the HTTP adapter and the
// maintenance services take flows through it; only *Flow values implement it.
type AnyFlow interface {
	Name() string
	PhaseNames() []string

	retentionOr(d time.Duration) time.Duration
	abandonAfterOr(d time.Duration) time.Duration
	// phaseIndex finds the phase a name or former name names (a mark).
	phaseIndex(name string) (int, bool)
	// resumeAt is the index of the phase a key recorded at recoveryPoint
	// resumes with; it counts former names and retired phases.
	resumeAt(recoveryPoint string) (int, bool)
	// downstreamName is phase i's identity in downstream keys: its oldest
	// name.
	downstreamName(i int) string
	// recoveryPoints lists every recovery point a key of the flow can be
	// recorded at and resume from.
	recoveryPoints() []string
	// namesOf lists phase i's name and former names.
	namesOf(i int) []string
	// phaseMeta describes phase i; iso is the isolation level of the
	// transaction it runs in, its join chain's first phase's (empty: the
	// runner's default).
	phaseMeta(i int) (name string, kind ForeignKind, iso pgx.TxIsoLevel)
	// joinsPrevious reports whether phase i runs in the transaction of
	// phase i-1 (Phase.JoinPrevious).
	joinsPrevious(i int) bool
	prepare(req *Request, keys [][]byte) (*prepared, error)
	// decodeStored decodes a key's stored params into today's input type,
	// tolerantly; an error wraps ErrUndecodableParams.
	decodeStored(stored []byte) (any, error)
	Redrives() bool
	callDo(ctx context.Context, tx Tx, h *held) (Result, error)
	callReconcile(ctx context.Context, tx Tx, h *held) (ReconcileVerdict, error)
	// reconcilable reports whether phase i has a Reconcile hook.
	reconcilable(i int) bool
}

func (f *Flow[In]) retentionOr(d time.Duration) time.Duration {
	if f.retention > 0 {
		return f.retention
	}
	return d
}

func (f *Flow[In]) abandonAfterOr(d time.Duration) time.Duration {
	if f.abandon != 0 {
		return f.abandon
	}
	return d
}

// Redrives reports whether the completer finishes this flow's requests
// server-side when their clients give up: true unless FlowConfig.NoRedrive.
// An HTTP adapter says so in the 500 of a failed request, whose client must
// then not make the request anew under another key.
func (f *Flow[In]) Redrives() bool { return !f.noRedrive }

func (f *Flow[In]) phaseIndex(name string) (int, bool) {
	i, ok := f.index[name]
	return i, ok
}

// currentName is the name of the phase that name names, as its name or one of
// its Phase.FormerNames; false when no phase of the flow has it. idemtest
// reads it through hooks.CurrentName.
func (f *Flow[In]) currentName(name string) (string, bool) {
	i, ok := f.index[name]
	if !ok {
		return "", false
	}
	return f.phases[i].Name, true
}

func (f *Flow[In]) resumeAt(recoveryPoint string) (int, bool) {
	if recoveryPoint == idemtype.RecoveryPointStarted {
		return 0, true
	}
	if i, ok := f.index[recoveryPoint]; ok {
		return i + 1, true
	}
	i, ok := f.retired[recoveryPoint]
	return i, ok
}

func (f *Flow[In]) downstreamName(i int) string {
	if p := f.phases[i]; len(p.FormerNames) > 0 {
		return p.FormerNames[0]
	}
	return f.phases[i].Name
}

func (f *Flow[In]) phaseMeta(i int) (string, ForeignKind, pgx.TxIsoLevel) {
	p := f.phases[i]
	// checkJoin holds a joined phase's own level to its chain's: the chain
	// runs at its first phase's, also when a key resumes in the middle of it
	// (the flow gained a JoinPrevious while the key was in flight).
	return p.Name, p.Foreign, f.phases[joinHead(f.phases, i)].Isolation
}

func (f *Flow[In]) joinsPrevious(i int) bool {
	return i > 0 && i < len(f.phases) && f.phases[i].JoinPrevious
}

func (f *Flow[In]) callDo(ctx context.Context, tx Tx, h *held) (Result, error) {
	return f.phases[h.phase].Do(ctx, tx, &Attempt[In]{h: h, input: h.input.(In)})
}

func (f *Flow[In]) callReconcile(ctx context.Context, tx Tx, h *held) (ReconcileVerdict, error) {
	hook := f.phases[h.phase].Reconcile
	if hook == nil {
		return ReconcileVerdict{}, &NoReconcileHookError{Flow: f.name, Phase: f.phases[h.phase].Name}
	}
	return hook(ctx, tx, &Attempt[In]{h: h, input: h.input.(In)})
}

func (f *Flow[In]) reconcilable(i int) bool {
	return i >= 0 && i < len(f.phases) && f.phases[i].Reconcile != nil
}

func (f *Flow[In]) namesOf(i int) []string {
	return append([]string{f.phases[i].Name}, f.phases[i].FormerNames...)
}

func (f *Flow[In]) recoveryPoints() []string {
	points := []string{idemtype.RecoveryPointStarted}
	// Not the last phase: it responds, and its key is finished; nor one
	// the next phase joins: their commit records the later one.
	for i, p := range f.phases[:len(f.phases)-1] {
		if f.phases[i+1].JoinPrevious {
			continue
		}
		points = append(points, p.Name)
		points = append(points, p.FormerNames...)
	}
	for retired := range f.retired {
		points = append(points, retired)
	}
	return points
}
