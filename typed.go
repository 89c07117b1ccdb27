package idem

import (
	"context"
	"fmt"
)

// Execute runs flow for req on r with input in: [Runner.Execute] with the
// input typed, so that an input of another type is a compile error rather
// than ErrInvalidParams at run time. req.Params must be left nil; in takes
// its place.
//
//	out, err := idem.Execute(ctx, runner, createOrder, idem.Request{Scope: tenant, Key: key}, OrderParams{SKU: "rocket"})
func Execute[In any](ctx context.Context, r *Runner, flow *Flow[In], req Request, in In) (*Outcome, error) {
	if req.Params != nil {
		err := fmt.Errorf("%w: idem.Execute takes the input as its argument; Request.Params must be nil", ErrInvalidParams)
		out := &Outcome{}
		out.settle(err)
		return out, err
	}
	req.Params = in
	return r.Execute(ctx, flow, req)
}
