// What a request is, as the runner sees it, and its validation.

package idem

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-idem/idem/idemtype"
)

// Request is one attempt of a client request, as the runner sees it.
type Request struct {
	// Scope is the tenant or user the key belongs to, derived from
	// authentication, never from the body: the same key in two scopes is two
	// independent requests. 1-255 characters.
	Scope string
	// Key is the client's idempotency key: 1-255 printable ASCII characters.
	Key string
	// Method and Path name the endpoint (Path is its route, such as a
	// ServeMux pattern, or the request path). Like the flow and the params,
	// they are bound to the key: the same key sent with another method or
	// path is a mismatch (ErrMismatch), and an unfinished key is never taken
	// over from another endpoint. Method defaults to POST.
	Method string
	Path   string
	// Params is the flow's input: a value of its In type (or a pointer to
	// one), or JSON that decodes into it.
	Params any

	// Payload is what the client sent, as it sent it, when Params was made
	// from it (an HTTP body, before it was decoded). The key's fingerprint
	// is taken over it rather than over Params, so a retry of the same
	// bytes matches its first attempt whatever a deploy changed in the
	// input type in between (a field added, a tag renamed, another value
	// filled in by the server); other bytes that mean the same JSON
	// (internal/canonical) match too. Nil takes the JSON that Params
	// is, when it is JSON, and otherwise the JSON encoding of the input.
	Payload []byte
	// PayloadBinary says Payload is not JSON but bytes compared as they
	// are (idemgrpc: the deterministic wire encoding of the message).
	PayloadBinary bool
	// Target is what else of the request the input was made from that the
	// client chose, bound to the key with the payload: the HTTP request
	// target (escaped path and query), which Path (a route pattern) leaves
	// out; the full method name for gRPC. A retry with another target is a
	// mismatch. It is hashed, never stored; it must not contain NUL.
	// Default none.
	Target string

	// RetryOnly makes the request a retry of a key that exists with this
	// very payload (Payload and Target), when the payload no longer makes
	// an input (a deploy made the decoding stricter, or validation
	// refuses what it accepted): it never creates a key, and Params is
	// ignored. A finished key is replayed; an unfinished one is resumed
	// from the input stored with it, decoded as the completer decodes it
	// (ErrUndecodableParams when it cannot be; ErrNoRedrive for a flow with
	// FlowConfig.NoRedrive). No key, or a key made by another payload, is
	// ErrNotFound or ErrMismatch, and the caller answers the payload's own
	// problem. Only keys fingerprinted over their payload (this release on)
	// match. idemhttp sets it for a body it cannot decode or validate.
	RetryOnly bool

	// Wait is how long the request waits, when another attempt holds its
	// key, for that attempt to end, instead of returning ErrInProgress at
	// once: it is then acquired again, as a retry arriving at that moment
	// would be, and gets the stored response (OutcomeReplayed), the
	// ErrNeedsReconcile of a key parked for reconciliation, or the key
	// itself, taken over and resumed, when the attempt failed and released
	// it or its holder died and its lease ran out. ErrInProgress when Wait
	// (or ctx) ends first. A waiting request holds no database connection:
	// the store watches the key for every waiter of the process at once
	// (idemdriver.Store.WatchKey: one check per tick, woken by a
	// notification where they work). Beyond Config.MaxWaiters waiting
	// requests, one is answered ErrInProgress at once, without waiting.
	// Outcome.Waited says how long it waited. Each acquisition
	// reports its event to the Observer (EventInProgress for each that
	// finds the key still held). When Wait passes, the key is acquired once
	// more before ErrInProgress is returned, so that an attempt that ended
	// without waking the waiter is still found. Zero (the default) does
	// not wait.
	Wait time.Duration

	// WaitContext, when set, also ends the waiting (Wait): when it is done,
	// the request stops waiting and returns ErrInProgress at once, without
	// acquiring the key again. It ends only the waiting: a request that
	// took the key over runs its flow under Execute's context. The
	// adapters set it to the request's own context, so that a client that
	// goes away does not keep a waiter.
	WaitContext context.Context

	// Acquired, when set, is called once this call holds the key (it
	// created it, or took over an unfinished one), with the key as held,
	// before the first phase runs, on the goroutine that called Execute. It
	// is not called for a replay, a key in flight or a mismatch. idemhttp
	// answers a request that asked to be answered asynchronously from it
	// (202 Accepted), while the flow goes on. It must not block.
	Acquired func(rec *idemtype.KeyRecord)
}

func (q *Request) normalise() error {
	if q.Method == "" {
		q.Method = "POST"
	}
	for _, f := range [...]struct{ name, v string }{{"scope", q.Scope}, {"method", q.Method}, {"path", q.Path}} {
		if !utf8.ValidString(f.v) || strings.IndexByte(f.v, 0) >= 0 {
			return fmt.Errorf("%w: %s must be UTF-8 without NUL characters", ErrInvalidRequest, f.name)
		}
	}
	switch {
	case q.Scope == "" || len(q.Scope) > 255:
		return fmt.Errorf("%w: scope must be 1-255 bytes", ErrInvalidRequest)
	case !ValidKey(q.Key):
		return fmt.Errorf("%w: key must be 1-255 printable ASCII characters", ErrInvalidRequest)
	case len(q.Method) > 16:
		return fmt.Errorf("%w: method longer than 16 bytes", ErrInvalidRequest)
	case len(q.Path) > 2048:
		return fmt.Errorf("%w: path longer than 2048 bytes", ErrInvalidRequest)
	case strings.IndexByte(q.Target, 0) >= 0:
		return fmt.Errorf("%w: target must not contain NUL characters", ErrInvalidRequest)
	}
	return nil
}

// acquired tells the caller, when it asked (Acquired), that it holds the
// key.
func (q *Request) acquired(rec *idemtype.KeyRecord) {
	if q.Acquired != nil {
		// A copy: the runner goes on changing its own as phases commit.
		q.Acquired(rec.Clone())
	}
}

// ValidKey reports whether key is an acceptable idempotency key: 1-255
// printable ASCII characters (0x20-0x7E).
func ValidKey(key string) bool {
	if len(key) == 0 || len(key) > 255 {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return false
		}
	}
	return true
}
