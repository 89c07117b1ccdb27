// Package idem makes multi-step POST endpoints safe to retry.
//
// A client that retries after a dropped connection, a timeout or a crashed
// pod must never be charged twice, and must never lose its order either. An
// idempotency key alone does not give that when one request does several
// things: creating a row, calling a payment provider, enqueuing an email.
// Caching "the response" is not enough when the process died between the
// charge and the response. idem gives each request a durable recovery point,
// in the style of Stripe's Idempotency-Key and Brandur Leach's atomic phases.
//
// # The model
//
// A [Flow] is an endpoint: a name and an ordered list of [Phase] values. Each
// phase runs in its own Postgres transaction and may make at most one foreign
// call ([Attempt.Foreign]) to a system outside that transaction. When a phase
// commits, the key's recovery point (the phase's name) commits in the same
// transaction as the phase's own writes, so the two can never disagree. The
// last phase, or any phase that has a final answer such as a declined card,
// responds; the response is stored and every retry replays it byte for byte.
//
//	started --ride_created--> ride_created --charge_created--> charge_created --respond--> finished
//
// A retry after a crash resumes at the phase after the recovery point. Phases
// before it never run again; the phase that was interrupted runs again from
// the start, which is safe because its writes rolled back and its foreign
// call carries a downstream idempotency key ([Attempt.IdempotencyKey]) that the
// provider deduplicates. A provider that cannot deduplicate is declared with
// [ForeignNotIdempotent]: the attempt is recorded before the call and an
// interrupted phase goes to reconciliation ([Runner.Reconcile]) instead of
// running twice; a call that knows its request never left (the connection
// was refused) returns its error wrapped with [NotSent], and the phase fails
// like any other, for the client's retry.
//
// A phase that makes no foreign call may share the transaction and commit
// of the phase before it ([Phase].JoinPrevious): one commit fewer per
// request, at the price of re-running both after a crash between them.
//
// # The runner
//
// [Runner.Execute] does, for one attempt of a request:
//
//  1. Acquire the key in one statement: insert it locked, or take over an
//     unfinished key whose lease has expired, or report what is there.
//  2. Decide: a different payload, flow, method or path under the same key
//     is a mismatch ([ErrMismatch]); a finished key is replayed; a key held
//     by a live lease is in progress ([ErrInProgress], with a Retry-After);
//     a key waiting for reconciliation says so ([ErrNeedsReconcile]).
//  3. Resume: run each remaining phase in its transaction, recording the new
//     recovery point guarded by the fencing token taken at acquisition, so a
//     worker that was taken over can never commit ([ErrLockLost]).
//  4. Finish: the responding phase stores the response, finishes the key and
//     releases it, in its own transaction.
//
// A phase that returns an error (or panics) rolls back, releases the key and
// stores no response: the client gets a retryable failure and its retry
// resumes. The phases that committed before it stay, and the key stays
// bound to its request.
// A worker that dies releases nothing; its lease (Config.Lease, 90 s by
// default) expires and the next retry takes over, or, sooner, its instance
// restarts and takes it over at once (pgstore.Config.Instance). A live
// worker renews its lease with a heartbeat, however slow its phase.
//
// # Using it
//
// Declare the flow once, make one runner per process on a store (package
// pgstore), and call Execute per request, or mount the flow as an http.Handler
// with package idemhttp, which adds the Idempotency-Key header contract:
//
//	flow := idem.MustNewFlow("rides.create", []idem.Phase[RideParams]{
//		{Name: "ride_created", Do: createRide},
//		{Name: "charge_created", Do: chargeCard},
//		{Name: "receipt_enqueued", Do: enqueueReceiptAndRespond},
//	}, nil)
//	store, err := pgstore.New(pool, nil)
//	runner, err := idem.NewRunner(store, &idem.Config{Flows: []idem.AnyFlow{flow}})
//	out, err := runner.Execute(ctx, flow, idem.Request{Scope: userID, Key: key, Params: params})
//
// A phase's body has the shape
//
//	func(ctx context.Context, tx idem.Tx, a *idem.Attempt[RideParams]) (idem.Result, error)
//
// tx is the phase's transaction, with statements only (the DBTX shape sqlc
// generates: db.New(tx) works): the runner commits it together with the
// recovery point, so a phase never commits or rolls back. a is the phase's
// handle on the request: its input, the key, checkpoints earlier phases left,
// and the one foreign call (Attempt.Foreign), which receives the downstream
// idempotency key.
//
// # The packages
//
// This package is what a flow author uses. Package idemdriver is the contract
// a store implements (as database/sql/driver is for database/sql); pgstore is
// the Postgres implementation and migrations its schema. idemhttp mounts a flow
// as an http.Handler with the Idempotency-Key contract; idemtest crashes a flow
// at every phase boundary and checks that nothing ran twice. The maintenance
// services (Runner.Reap, Runner.Complete, Runner.ReconcileAll, Maintainer)
// reap expired keys, complete requests whose clients gave up and run
// reconciliation;
// Runner.Start runs them all in the background and Runner.Stop stops them.
// docs/design.md describes the state machine in full.
package idem
