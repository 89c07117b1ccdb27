// Package idemtest checks, against real Postgres, that a flow keeps idem's
// promise: a crash anywhere never duplicates an effect and never changes the
// answer.
//
// Give it the flow, an input, a database and the invariants only you know,
// and it runs the flow once uninterrupted (the baseline), learns the phases
// it went through and the foreign calls they made, and then runs one
// scenario per crash point, each on a fresh key:
//
//	func TestCreateOrder(t *testing.T) {
//		t.Parallel()
//		schema := idemtest.NewSchema(t) // idem's tables migrated; create yours in it
//		...
//		idemtest.Explore(t, idemtest.Config[orders.Params]{
//			Pool:    schema.Pool,
//			Flow:    orders.NewFlow(payments),
//			Input:   orders.Params{SKU: "rocket", Quantity: 2},
//			Compare: idemtest.EqualJSON("id", "charge_id"),
//			Check:   exactlyOneOrderAndOneCharge,
//		})
//	}
//
// (examples/orders in the repository has this test in full.)
//
// # Scenarios
//
// At every phase of the baseline's path the kit runs each [Kind]:
//
//   - [CrashBeforeCommit]: the worker dies after the phase did its work,
//     right before its commit.
//   - [CrashAfterForeign] (phases that made a foreign call): the worker dies
//     right after the call returned. The effect happened, the phase did not
//     commit.
//   - [CrashAfterCommit]: the worker dies right after the phase committed.
//   - [LostCommitAck]: the commit succeeded but the worker saw an error.
//   - [SerializationFailure]: the phase fails with SQLSTATE 40001 once.
//   - [LeaseTakeover]: the worker pauses before the commit until its lease
//     runs out; a second worker takes the key over and finishes the request;
//     then the first resumes. It must end with idem.ErrLockLost.
//
// After its fault, a scenario retries like a client that does not give up:
// with a new runner each time (a new process), running the scenario's clock
// past the lease when a worker died, calling Runner.Reconcile when the key
// needs reconciliation, until the request has its final response. It then
// checks that:
//
//   - a retry replays that response byte for byte;
//   - the response equals the baseline's, per Config.Compare;
//   - the key is finished, unlocked, with no foreign mark;
//   - every phase of the path committed exactly once, by the phase or by its
//     reconcile hook, and no other phase did;
//   - every foreign call the baseline made was made, an idempotent one with
//     one downstream key throughout (repeats with that key are the
//     provider's to deduplicate), and a not-idempotent one never again
//     unless a reconcile hook said it had not happened;
//   - the registered Providers received only downstream keys the runner
//     handed out in the scenario, and all of them;
//   - in crash_before_commit, no row that another transaction wrote while
//     the phase ran outlived the phase's rollback: a write through the pool
//     instead of the phase's tx (see [BypassCheck]);
//   - Config.Check holds.
//
// # How faults are injected
//
// Only through each runner's Config.Test: a Hook that returns
// idem.ErrSimulatedCrash (the runner stops as a dead process would, its
// transaction rolled back and its lock kept), another error at the commit
// (a lost acknowledgement), a *pgconn.PgError with code 40001, or blocks (the
// paused worker); and a clock (Test.Now) of the scenario's own, which the
// kit moves forward instead of sleeping. No global state is touched, so
// explorations run in parallel, in parallel tests.
//
// In the takeover scenario the paused worker holds its transaction open. If
// the second worker then waits for one of its row locks (both update the
// same row, or insert the same unique value), the kit sees it in pg_locks
// and lets the first resume, as a paused process eventually would: its
// commit is refused by the fence and rolls back, which frees the lock.
//
// For faults on the network instead (a reply lost after the server ran the
// command, a stall, a reset, latency), run any code through a [FaultProxy].
//
// # What it cannot see
//
// The kit sees what the runner does: phases, commits, foreign calls made
// through Attempt.Foreign and the keys handed to them; of your tables, only
// the rows a write through the pool left behind after a rollback (see
// [BypassCheck]). It cannot see your providers. A call made outside
// Attempt.Foreign or with a key other than the one it was handed is only
// caught by a Config.Check that counts charges, or by a provider given in
// Config.Providers; a delete through the pool, only by a Check. It explores the
// path Input takes; explore each other path (a decline, a validation
// failure) with an Input that takes it. And it trusts a reconcile hook's
// verdict: a hook that says "not done" about a message that was sent makes
// the runner send it again, which again only Check can notice.
//
// docs/testing.md in the repository walks through a failure report.
package idemtest
