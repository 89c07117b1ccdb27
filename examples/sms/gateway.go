package sms

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Gateway is what the flow needs from an SMS provider: sending, and looking
// up what was sent under a reference of ours. *FakeGateway implements it.
type Gateway interface {
	// Send sends one message. Every call that reaches the gateway sends a
	// new message: there is no idempotency key. An error other than a
	// *RejectedError leaves the outcome unknown.
	Send(ctx context.Context, m Outgoing) (*Message, error)
	// Lookup returns the messages sent with reference, oldest first.
	Lookup(ctx context.Context, reference string) ([]Message, error)
}

// Outgoing is a message to send.
type Outgoing struct {
	To   string
	Body string
	// Reference is the sender's own reference, recorded on the message and
	// searchable with Lookup. The gateway does not deduplicate on it.
	Reference string
}

// Message is a message the gateway sent.
type Message struct {
	ID        string
	To        string
	Body      string
	Reference string
}

// ErrTimeout is a send whose answer never came: the message may or may not
// have gone out.
var ErrTimeout = errors.New("sms gateway: timeout")

// ErrLookupUnavailable is a lookup the gateway could not answer.
var ErrLookupUnavailable = errors.New("sms gateway: lookup unavailable")

// RejectedError is the gateway's definite refusal: nothing was sent, and
// sending again would be refused again.
type RejectedError struct {
	To     string
	Reason string
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("sms gateway: message to %s rejected: %s", e.To, e.Reason)
}

// FakeGateway is an in-memory SMS gateway without idempotency keys, with the
// faults that make such a provider hard: a request lost on the way, an
// answer lost on the way back, a lookup that cannot answer. It is safe for
// concurrent use; the zero value is ready.
type FakeGateway struct {
	mu         sync.Mutex
	messages   []Message
	faults     []sendFault
	rejected   map[string]string
	lookupDown bool
}

type sendFault int

const (
	loseRequest sendFault = iota + 1
	loseAnswer
)

var _ Gateway = (*FakeGateway)(nil)

// Send implements Gateway.
func (g *FakeGateway) Send(ctx context.Context, m Outgoing) (*Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var fault sendFault
	if len(g.faults) > 0 {
		fault, g.faults = g.faults[0], g.faults[1:]
	}
	if fault == loseRequest {
		return nil, fmt.Errorf("%w: the request never arrived", ErrTimeout)
	}
	if reason, ok := g.rejected[m.To]; ok {
		return nil, &RejectedError{To: m.To, Reason: reason}
	}
	msg := Message{ID: fmt.Sprintf("sm_%d", len(g.messages)+1), To: m.To, Body: m.Body, Reference: m.Reference}
	g.messages = append(g.messages, msg)
	if fault == loseAnswer {
		return nil, fmt.Errorf("%w: the answer never came back", ErrTimeout)
	}
	return &msg, nil
}

// Lookup implements Gateway.
func (g *FakeGateway) Lookup(ctx context.Context, reference string) ([]Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lookupDown {
		return nil, ErrLookupUnavailable
	}
	var out []Message
	for _, m := range g.messages {
		if m.Reference == reference {
			out = append(out, m)
		}
	}
	return out, nil
}

// LoseNextRequest makes the next send time out before reaching the gateway:
// nothing is sent.
func (g *FakeGateway) LoseNextRequest() { g.addFault(loseRequest) }

// LoseNextAnswer makes the next send go out but time out on the way back:
// the message is sent, the caller sees ErrTimeout.
func (g *FakeGateway) LoseNextAnswer() { g.addFault(loseAnswer) }

func (g *FakeGateway) addFault(f sendFault) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.faults = append(g.faults, f)
}

// Reject makes every send to number fail with a *RejectedError.
func (g *FakeGateway) Reject(number, reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.rejected == nil {
		g.rejected = map[string]string{}
	}
	g.rejected[number] = reason
}

// SetLookupDown makes lookups fail (true) or answer again (false).
func (g *FakeGateway) SetLookupDown(down bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lookupDown = down
}

// Sent returns every message sent, oldest first.
func (g *FakeGateway) Sent() []Message {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]Message(nil), g.messages...)
}
