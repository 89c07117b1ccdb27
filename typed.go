package idem

import (
	"context"
	"fmt"
)

// Typed helpers over the Attempt and Runner API, for the common cases where
// the value's type is known at the call site.

// CheckpointOf returns what an earlier phase (or this one) recorded under
// name with [Attempt.SetCheckpoint], decoded as a T, and whether anything
// was recorded. It is [Attempt.Checkpoint] without the destination
// variable:
//
//	orderID, ok, err := idem.CheckpointOf[int64](run, "order_id")
func CheckpointOf[T, In any](a *Attempt[In], name string) (T, bool, error) {
	var v T
	ok, err := a.Checkpoint(name, &v)
	return v, ok, err
}

// ForeignValue is [Attempt.Foreign] for a call that returns a value, such as
// the provider's charge: call receives the downstream idempotency key, and
// what it returns is returned. When Foreign refuses to make the call (a
// second foreign call in the phase, a not-idempotent attempt that could not
// be recorded, a lease that may have lapsed), call does not run and the
// value is T's zero value.
//
//	charge, err := idem.ForeignValue(ctx, run, "charge", func(ctx context.Context, key string) (*stripe.Charge, error) {
//		return payments.Charge(ctx, key, run.Input().Amount)
//	})
func ForeignValue[T, In any](ctx context.Context, a *Attempt[In], name string, call func(ctx context.Context, idempotencyKey string) (T, error)) (T, error) {
	var v T
	err := a.Foreign(ctx, name, func(ctx context.Context, key string) error {
		var err error
		v, err = call(ctx, key)
		return err
	})
	return v, err
}

// Execute runs the flow for req on r with input in: [Runner.Execute] with
// the input typed, so that an input of another type is a compile error
// rather than ErrInvalidParams at run time. req.Params must be left nil; in
// takes its place.
//
//	out, err := createOrder.Execute(ctx, runner, idem.Request{Scope: tenant, Key: key}, OrderParams{SKU: "rocket"})
func (f *Flow[In]) Execute(ctx context.Context, r *Runner, req Request, in In) (*Outcome, error) {
	if req.Params != nil {
		err := fmt.Errorf("%w: Flow.Execute takes the input as its argument; Request.Params must be nil", ErrInvalidParams)
		out := &Outcome{}
		out.settle(err)
		return out, err
	}
	req.Params = in
	return r.Execute(ctx, f, req)
}
