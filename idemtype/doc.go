// Package idemtype holds the values idem's runner, its stores and its
// operators share: the persisted key ([KeyRecord]) with its
// [StoredStatus] and the [KeyState] an operator sees, the [Response] a flow
// answers, the queries and pages of the key listing ([KeyQuery],
// [KeyList]), the unfinished-key [Backlog], an operator's recorded
// [Verdict], and the errors a store maps its failures to ([ErrLockLost],
// [ErrStoreUnavailable], [ErrSerialization], [ErrInvalidRequest],
// [ErrNotFound], [ErrPhaseOwnsTx]).
//
// It is a leaf: it imports nothing of idem, so package idem, the driver
// contract (idemdriver), the stores and the adapters can all use its types
// without importing one another. Package idem re-exports the error values
// under the same names (errors.Is matches either); every other name is
// used from here.
package idemtype
