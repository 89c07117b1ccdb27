package idemtype

import "time"

// Backlog is what the store's Backlog counted.
type Backlog struct {
	// Now is the database clock the backlog was read at.
	Now time.Time
	// Statuses are StoredRunning and StoredNeedsReconcile, in that order.
	Statuses []StatusBacklog
}

// StatusBacklog is the unfinished keys in one status.
type StatusBacklog struct {
	Status StoredStatus
	Keys   int64
	// Oldest is when the oldest of them was created; zero when Keys is 0.
	Oldest time.Time
}

// OldestAge is how long ago the oldest key of the status was created, as
// of the backlog's clock; zero when there is none.
func (b *Backlog) OldestAge(status StoredStatus) time.Duration {
	for _, s := range b.Statuses {
		if s.Status == status && s.Keys > 0 {
			return max(b.Now.Sub(s.Oldest), 0)
		}
	}
	return 0
}

// Keys is the number of unfinished keys in the status.
func (b *Backlog) Keys(status StoredStatus) int64 {
	for _, s := range b.Statuses {
		if s.Status == status {
			return s.Keys
		}
	}
	return 0
}

// UnlockResult is what an unlock (idem.Runner.UnlockKey) did.
type UnlockResult struct {
	// Record is the key after the statement.
	Record *KeyRecord
	// Unlocked is false when the key was finished and nothing changed.
	Unlocked bool
}
