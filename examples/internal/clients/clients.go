// Package clients runs a batch of requests the way several concurrent
// clients would, for the examples' tests that drive a service through a fault
// (a failover, say) and need every request to reach its final answer.
package clients

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
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

// CountKeys counts the keys among keys, on db, that match condition (its
// first placeholder is $2, args fill it and the next). The condition reads
// key, status, foreign_mark, locked_at and lease_expires_at: the lease is
// the key's lease row's when it has one, else its row's first lease, as
// every reader of a lease reads it.
func CountKeys(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, keys []string, condition string, args ...any) (int, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT count(*) FROM (
		SELECT k.key, k.status, l.foreign_mark,
		       CASE WHEN l.key_id IS NULL THEN k.locked_at ELSE l.locked_at END AS locked_at,
		       CASE WHEN l.key_id IS NULL THEN k.lease_expires_at ELSE l.lease_expires_at END AS lease_expires_at
		FROM idem_keys k LEFT JOIN idem_leases l ON l.scope = k.scope AND l.key_id = k.id) k
		WHERE k.key = ANY($1) AND `+condition,
		append([]any{keys}, args...)...).Scan(&n)
	return n, err
}
