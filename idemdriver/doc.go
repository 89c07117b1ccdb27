// Package idemdriver is the contract between idem's runner and a store, as
// database/sql/driver is between database/sql and a driver: flow authors never
// need it; store implementers and the runner share it.
//
// The runner (package idem) holds the state machine; a store holds the SQL.
// [Store] is what the runner calls: acquire a key in one statement, begin a
// phase's transaction, renew and release the lease, mark a not-idempotent
// call, park a key for reconciliation, and the operations (list, unlock,
// claim idle keys, reap). The phase's transaction is the store's own type,
// [PhaseTx]: the runner hands its statement methods to the phase (as idem.Tx)
// and ends it itself, with the fenced [PhaseTx.CommitPhase] that records the
// key's recovery point in the same transaction as the phase's writes.
//
// The record a store reads and writes ([KeyRecord], [Status], [Response]) and
// the errors it maps driver failures to ([ErrLockLost], [ErrStoreUnavailable],
// [ErrSerialization], [ErrInvalidRequest], [ErrNotFound]) are defined here;
// package idem exports the same types and values under the same names, so
// callers of either package see one set.
//
// github.com/go-idem/idem/pgstore is the implementation, on pgx/v5.
package idemdriver
