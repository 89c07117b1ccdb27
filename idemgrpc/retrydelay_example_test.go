package idemgrpc_test

import (
	"context"
	"time"

	"github.com/go-idem/idem/idemgrpc"
	"github.com/go-idem/idem/idemgrpc/example/rides/ridespb"
)

// A client retries what the server asks it to retry, after the delay the
// status's RetryInfo gives, with the same key and the same message.
func ExampleRetryDelay() {
	retry := func(ctx context.Context, client ridespb.RidesClient, req *ridespb.CreateRideRequest) (*ridespb.Ride, error) {
		for {
			res, err := client.CreateRide(ctx, req)
			if delay, ok := idemgrpc.RetryDelay(err); ok {
				// wait delay, then retry with the same key and the same message
				select {
				case <-time.After(delay):
					continue
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return res, err
		}
	}
	_ = retry
}
