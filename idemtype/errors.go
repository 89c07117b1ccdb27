package idemtype

import "errors"

// The errors a store returns, which the runner branches on. Package idem
// exports the same values under the same names (idem.ErrLockLost is
// idemtype.ErrLockLost), so errors.Is matches against either package.
var (
	// ErrInvalidRequest: the request itself is unusable (empty scope, a key
	// that is not 1-255 printable ASCII characters, params that do not decode
	// into the flow's input). Nothing was written.
	ErrInvalidRequest = errors.New("idem: invalid request")

	// ErrLockLost: the lease was taken over (or the key force-unlocked) while
	// this worker ran; its uncommitted phase was rolled back. Another worker
	// owns the request now.
	ErrLockLost = errors.New("idem: lock lost")

	// ErrStoreUnavailable: the database could not be reached. When it happens
	// before acquisition no phase ran (fail closed).
	ErrStoreUnavailable = errors.New("idem: store unavailable")

	// ErrSerialization is what a store maps serialization failures and
	// deadlocks to; the runner retries phases that fail with it.
	ErrSerialization = errors.New("idem: serialization failure")

	// ErrPhaseOwnsTx is what Commit and Rollback of a phase's pgx.Tx view
	// (idem.Attempt.PgxTx) return: only the runner ends a phase's
	// transaction, together with the key's recovery point.
	ErrPhaseOwnsTx = errors.New("idem: a phase's transaction is committed and rolled back by the runner, not by the phase")

	// ErrNotFound: no key with that scope and key exists.
	ErrNotFound = errors.New("idem: key not found")
)
