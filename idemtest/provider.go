package idemtest

import (
	"context"
	"fmt"
	"strings"
	"sync"
)

// Provider is a fake downstream service that deduplicates on idempotency
// keys, the way Stripe does: the first call with a key makes an effect (a
// charge, a shipment), and every later call with that key gets the same
// effect back without a new one. A call without a key is not deduplicated,
// so code that forgets the key double-charges visibly.
//
// Each effect is made for a subject, a string you choose that names what the
// effect is for (the idempotency key of the request, an order id), so a test
// can ask for exactly one effect per subject with ExpectOne. Hand providers
// to Config.Providers and the kit also checks, per scenario, that every call
// carried a downstream key the runner handed out.
//
// The zero value is ready to use, and a Provider is safe for concurrent use.
type Provider struct {
	mu      sync.Mutex
	calls   []ProviderCall
	effects []Effect
	byKey   map[string]int // downstream key -> index in effects
	failing []error
}

// Effect is something the provider did once.
type Effect struct {
	// ID is the provider's id for the effect: fx_1, fx_2, ...
	ID string
	// Key is the idempotency key of the call that made it; empty for a call
	// without one.
	Key string
	// Subject is what the effect is for, as the caller said.
	Subject string
}

// ProviderCall is one call that reached the provider.
type ProviderCall struct {
	Key     string
	Subject string
	// Effect is the effect the call made or was deduplicated to; empty when
	// the call failed.
	Effect string
	// Deduplicated is true when an earlier call with the same key had made
	// the effect.
	Deduplicated bool
	// Err is the error the call returned.
	Err error

	// Scenario is the idempotency key of the kit's scenario whose worker
	// made the call: ScenarioOf the call's context. A fake of your own
	// sets it so that the kit tells the calls of scenarios running side
	// by side apart exactly; without it, the kit tells them apart by
	// downstream key, and a call with a key no worker was handed is
	// reported by every scenario that was running when it came.
	Scenario string
}

// Do makes the effect for subject under the idempotency key key, or returns
// the effect an earlier call with key made. Reusing a key for another subject
// is refused, as Stripe refuses a key reused with other parameters. A call
// failed with FailNext makes no effect.
func (p *Provider) Do(ctx context.Context, key, subject string) (Effect, error) {
	if err := ctx.Err(); err != nil {
		return Effect{}, err // the call never left the caller
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	call := ProviderCall{Key: key, Subject: subject, Scenario: ScenarioOf(ctx)}
	if len(p.failing) > 0 {
		call.Err, p.failing = p.failing[0], p.failing[1:]
		p.calls = append(p.calls, call)
		return Effect{}, call.Err
	}
	if i, ok := p.byKey[key]; ok && key != "" {
		e := p.effects[i]
		if e.Subject != subject {
			call.Err = fmt.Errorf("idemtest: provider: key %q was first used for subject %q, not %q", key, e.Subject, subject)
			p.calls = append(p.calls, call)
			return Effect{}, call.Err
		}
		call.Effect, call.Deduplicated = e.ID, true
		p.calls = append(p.calls, call)
		return e, nil
	}
	e := Effect{ID: fmt.Sprintf("fx_%d", len(p.effects)+1), Key: key, Subject: subject}
	p.effects = append(p.effects, e)
	if key != "" {
		if p.byKey == nil {
			p.byKey = map[string]int{}
		}
		p.byKey[key] = len(p.effects) - 1
	}
	call.Effect = e.ID
	p.calls = append(p.calls, call)
	return e, nil
}

// FailNext makes the next call fail with err before any effect is made, as
// a provider that is down would. Calls queue: FailNext twice fails two calls.
func (p *Provider) FailNext(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failing = append(p.failing, err)
}

// Calls returns every call that reached the provider, in order.
func (p *Provider) Calls() []ProviderCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]ProviderCall(nil), p.calls...)
}

// Effects returns the effects made for subject, in order; all effects when
// subject is empty.
func (p *Provider) Effects(subject string) []Effect {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Effect
	for _, e := range p.effects {
		if subject == "" || e.Subject == subject {
			out = append(out, e)
		}
	}
	return out
}

// ExpectOne returns an error unless exactly one effect was made for
// subject. Use it in Config.Check to catch double charges.
func (p *Provider) ExpectOne(subject string) error {
	effects := p.Effects(subject)
	if len(effects) == 1 {
		return nil
	}
	if len(effects) == 0 {
		return fmt.Errorf("provider made no effect for %q, want exactly one", subject)
	}
	desc := make([]string, len(effects))
	for i, e := range effects {
		desc[i] = fmt.Sprintf("%s (key %q)", e.ID, e.Key)
	}
	return fmt.Errorf("provider made %d effects for %q, want exactly one: %s", len(effects), subject, strings.Join(desc, ", "))
}

// FakeProvider is a fake downstream service the kit can audit
// (Config.Providers): Calls returns every call it has received so far, in
// order, each with the idempotency key it carried ("" for none) and what it
// was for (ProviderCall.Subject, used in reports). Calls only ever grows.
// *Provider is one; a fake of your own needs only this method:
//
//	func (f *fakeStripe) Calls() []ProviderCall {
//		f.mu.Lock()
//		defer f.mu.Unlock()
//		out := make([]ProviderCall, len(f.requests))
//		for i, r := range f.requests {
//			out[i] = ProviderCall{Key: r.IdempotencyKey, Subject: r.Customer, Effect: r.ChargeID}
//		}
//		return out
//	}
//
// The kit holds the calls to more than their keys. Subject, when set, is
// what the request asked for: two calls with one downstream key and
// different subjects are one request changed between runs (it names a row
// a rolled-back transaction created), which a fake that deduplicates on the
// key alone answers with the first request's effect. Effect, when set, is
// what the provider made: two effects for one key are a provider that does
// not deduplicate, called from a phase declared ForeignIdempotent.
// Scenario (ScenarioOf the call's context) attributes the call exactly.
type FakeProvider interface {
	Calls() []ProviderCall
}

var _ FakeProvider = (*Provider)(nil)

// callMark returns a position in p's call log, for callsSince.
func callMark(p FakeProvider) int { return len(p.Calls()) }

// callsSince returns the calls p received after mark.
func callsSince(p FakeProvider, mark int) []ProviderCall {
	calls := p.Calls()
	if mark >= len(calls) {
		return nil
	}
	return calls[mark:]
}

// scenarioKey is the context key under which the kit's workers carry their
// scenario's key, so that a provider can tell which scenario a call came
// from when scenarios run side by side.
type scenarioKey struct{}

func withScenario(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, scenarioKey{}, key)
}

// ScenarioOf returns the idempotency key of the kit's scenario whose worker
// ctx comes from (the context Attempt.Foreign hands its call, and any
// derived from it), or "" outside a scenario. A fake provider of your own
// records it in ProviderCall.Scenario.
func ScenarioOf(ctx context.Context) string {
	key, _ := ctx.Value(scenarioKey{}).(string)
	return key
}
