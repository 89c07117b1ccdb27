package testfixture

import (
	"errors"
	"fmt"
	"sync"
)

// ErrDeclined is what Provider.Charge returns for an amount marked with
// Provider.Decline.
var ErrDeclined = errors.New("card declined")

// Provider is an idempotent payment provider: the first charge with a
// downstream key makes a charge (ch_1, ch_2, ... in order), and every later
// charge with that key returns the same one. The zero value is ready to use,
// and it is safe for concurrent use.
type Provider struct {
	mu       sync.Mutex
	charges  map[string]string // downstream key -> charge id
	declined map[float64]bool
	calls    int
}

// Charge charges amount under the downstream key, or returns the charge an
// earlier call with key made. A declined amount makes no charge and returns
// ErrDeclined.
func (p *Provider) Charge(key string, amount float64) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.declined[amount] {
		return "", ErrDeclined
	}
	if id, ok := p.charges[key]; ok {
		return id, nil
	}
	if p.charges == nil {
		p.charges = map[string]string{}
	}
	id := fmt.Sprintf("ch_%d", len(p.charges)+1)
	p.charges[key] = id
	return id, nil
}

// Decline makes every later charge of amount fail with ErrDeclined.
func (p *Provider) Decline(amount float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.declined == nil {
		p.declined = map[float64]bool{}
	}
	p.declined[amount] = true
}

// Charges is the number of charges made, one per downstream key.
func (p *Provider) Charges() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charges)
}

// Calls is the number of Charge calls, duplicates and declines included.
func (p *Provider) Calls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}
