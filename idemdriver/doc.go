// Package idemdriver is the contract between idem's runner and a store, as
// database/sql/driver is between database/sql and a driver. It is not for
// user code: applications hand a store (pgstore.Store) to idem.NewRunner and
// never call these methods themselves. It is not covered by semantic
// versioning: its interfaces and params change whenever the runner needs
// something new of a store, in any release.
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
// The values a store reads and writes (the key record, its response, the
// errors it maps driver failures to) are in package idemtype, which users
// share.
//
// github.com/go-idem/idem/pgstore is the implementation, on pgx/v5.
package idemdriver
