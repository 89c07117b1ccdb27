// Package clients runs a batch of requests the way several concurrent
// clients would, for the examples' tests that drive a service through a fault
// (a failover, say) and need every request to reach its final answer.
package clients

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Start hands each item to one of n workers, which call do on it, and returns
// a channel that receives the errors of every do joined (nil when all
// succeeded) once all have returned.
func Start[T any](items []T, n int, do func(T) error) <-chan error {
	work := make(chan T, len(items))
	for _, it := range items {
		work <- it
	}
	close(work)
	done := make(chan error, 1)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for range min(n, len(items)) {
		wg.Go(func() {
			for it := range work {
				if err := do(it); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	go func() {
		wg.Wait()
		done <- errors.Join(errs...)
	}()
	return done
}

// Wait waits for a channel Start returned, or for ctx to end first.
func Wait(ctx context.Context, done <-chan error) error {
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("requests unfinished: %w", ctx.Err())
	}
}
