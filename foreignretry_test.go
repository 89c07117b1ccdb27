package idem_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
)

// retryProvider answers each call with the next of its errors (nil once
// they run out), and records the downstream keys it was called with.
type retryProvider struct {
	mu     sync.Mutex
	errs   []error
	keys   []string
	effect map[string]bool // keys it acted on
}

func (p *retryProvider) call(_ context.Context, key string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keys = append(p.keys, key)
	var err error
	if len(p.errs) > 0 {
		err, p.errs = p.errs[0], p.errs[1:]
	}
	if err == nil || !errors.Is(err, idem.ErrNotSent) {
		p.effect[key] = true // acted on, even when its answer is an error
	}
	return err
}

// retryFlow is a one-phase flow of kind whose foreign call goes to p with
// policy.
func retryFlow(name string, kind idem.ForeignKind, policy idem.ForeignRetry, p *retryProvider) *idem.Flow[rideInput] {
	return idem.MustNewFlow(name, []idem.Phase[rideInput]{{
		Name:    "called",
		Foreign: kind,
		Do: func(ctx context.Context, _ idem.Tx, run *idem.Attempt[rideInput]) (idem.Result, error) {
			if err := run.ForeignRetrying(ctx, "call", policy, p.call); err != nil {
				return idem.Result{}, err
			}
			return idem.RespondJSON(http.StatusCreated, nil), nil
		},
		Reconcile: func(context.Context, idem.Tx, *idem.Attempt[rideInput]) (idem.ReconcileVerdict, error) {
			return idem.ReconcileUnknown("cannot ask"), nil
		},
	}}, nil)
}

// A foreign call with a retry policy is retried, with the same downstream
// key, where a retry cannot make its effect happen twice: a failure proven
// not sent, in any phase; any failure the policy accepts, in a phase whose
// provider deduplicates. A not-idempotent call in doubt is never retried.
// Tries are bounded, and none starts past the request's deadline.
func TestForeignRetrying(t *testing.T) {
	t.Parallel()
	transient := errors.New("503 from the provider")
	fast := idem.ForeignRetry{Attempts: 3, Backoff: time.Millisecond}
	for _, tc := range []struct {
		name    string
		kind    idem.ForeignKind
		policy  idem.ForeignRetry
		errs    []error
		timeout time.Duration
		calls   int
		want    error // nil: the request succeeds
		status  idemtype.StoredStatus
	}{
		{name: "idempotent, transient twice", kind: idem.ForeignIdempotent, policy: fast,
			errs: []error{transient, transient}, calls: 3, status: idemtype.StoredFinished},
		{name: "idempotent, tries run out", kind: idem.ForeignIdempotent, policy: fast,
			errs: []error{transient, transient, transient, transient}, calls: 3, want: idem.ErrPhaseFailed, status: idemtype.StoredRunning},
		{name: "idempotent, not retryable", kind: idem.ForeignIdempotent,
			policy: idem.ForeignRetry{Attempts: 3, Backoff: time.Millisecond, Retryable: func(err error) bool { return !errors.Is(err, transient) }},
			errs:   []error{transient}, calls: 1, want: idem.ErrPhaseFailed, status: idemtype.StoredRunning},
		{name: "not idempotent, not sent", kind: idem.ForeignNotIdempotent, policy: fast,
			errs: []error{idem.NotSent(transient), idem.NotSent(transient)}, calls: 3, status: idemtype.StoredFinished},
		{name: "not idempotent, in doubt", kind: idem.ForeignNotIdempotent, policy: fast,
			errs: []error{transient}, calls: 1, want: idem.ErrNeedsReconcile, status: idemtype.StoredNeedsReconcile},
		{name: "not idempotent, not sent then in doubt", kind: idem.ForeignNotIdempotent, policy: fast,
			errs: []error{idem.NotSent(transient), transient}, calls: 2, want: idem.ErrNeedsReconcile, status: idemtype.StoredNeedsReconcile},
		{name: "no try past the deadline", kind: idem.ForeignIdempotent, policy: idem.ForeignRetry{Attempts: 3, Backoff: time.Hour},
			errs: []error{transient}, timeout: time.Minute, calls: 1, want: idem.ErrPhaseFailed, status: idemtype.StoredRunning},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			p := &retryProvider{errs: tc.errs, effect: map[string]bool{}}
			flow := retryFlow("retry.flow", tc.kind, tc.policy, p)
			runner := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{flow}})
			ctx := context.Background()
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			_, err := runner.Execute(ctx, flow, b.request("k1", rideInput{Origin: "SFO", Amount: 1}))
			if tc.want == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tc.want)
			}
			require.Len(t, p.keys, tc.calls)
			for _, key := range p.keys {
				require.Equal(t, p.keys[0], key, "every try sends the same downstream key")
			}
			require.LessOrEqual(t, len(p.effect), 1, "one downstream key: the provider acts once at most")
			require.Equal(t, tc.status, b.key(t, "k1").Status)
		})
	}
}
