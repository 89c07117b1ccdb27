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
//		schema := NewSchema(t) // idem's tables migrated; create yours in it
//		...
//		Explore(t, Config[orders.Params]{
//			Pool:    schema.Pool,
//			Flow:    orders.NewFlow(payments),
//			Input:   orders.Params{SKU: "rocket", Quantity: 2},
//			Compare: EqualJSON("id", "charge_id"),
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
//   - [CrashAfterCommit]: the worker dies right after the phase committed;
//     unless that finished the request, its client comes back a day later,
//     so the phases after it run on another date (Attempt.Now).
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
//   - no foreign call was refused (a second Attempt.Foreign in a
//     transaction, which the runner never makes), whatever the phase did
//     with the refusal;
//   - the registered Providers received only downstream keys the runner
//     handed out in the scenario, and all of them; per key, one subject
//     and at most one effect (see FakeProvider);
//   - in crash_before_commit (and in serialization_failure and
//     lease_takeover at a phase a new key is acquired with), no row that
//     another transaction wrote while the phase ran outlived the phase's
//     rollback: a write through the pool instead of the phase's tx (see
//     [BypassCheck]);
//   - Config.Check holds.
//
// # Wire scenarios
//
// With Config.DatabaseURL, the kit also breaks the network under the
// runner, where the scenarios above break its steps. It runs the request
// once more through a [FaultProxy] (the wire baseline) and counts its round
// trips to Postgres; then, for each round trip N, on a fresh key, through a
// proxy and small pools of its own:
//
//   - [LostReply]: Postgres runs round trip N, its reply is lost, and the
//     worker's connection is reset.
//   - [StalledReply]: the network stalls as round trip N's reply comes back,
//     until the worker answers, which its statement timeouts
//     (Config.WireTimeout, default 2s) must make it do within ten times
//     that.
//
// Then the network heals; the client retries at once, gives up, and once
// the key has idled a completer pass (Runner.Complete) takes it, before the
// retries and reconcile runs every scenario makes. The checks are the same,
// and a commit whose reply never reached its worker is counted from the
// key. Wire scenarios run Config.WireParallelism (8) at a time, so Check,
// Compare, Setup and the Runner's Observer and hook (WithHook) must be safe for
// concurrent use; one that failed beside others (a stalled scenario holds
// its row locks, which a flow updating a shared row makes the others wait
// on) runs again alone and is held to that run (Scenario.RanAlone). A
// scenario whose round trip never came, in a request that went the
// baseline's way (a flow's statements may vary where its phases do not), is
// marked Missed rather than failed. The summary line counts wire scenarios
// apart: "16 scenarios over 3 phases (1 with a foreign call) and 26 wire
// scenarios over 13 round trips, 0 failed".
//
// # How faults are injected
//
// The scenarios at each phase inject theirs only through each runner's
// Config.Test: a hook (WithHook) that returns ErrSimulatedCrash (the runner stops
// as a dead process would, its transaction rolled back and its lock kept),
// another error at the commit (a lost acknowledgement), a *pgconn.PgError
// with code 40001, or blocks (the paused worker); and a clock (Test.Now) of
// the scenario's own, which the kit moves forward instead of sleeping. No
// global state is touched, so explorations run in parallel, in parallel
// tests.
//
// In the takeover scenario the paused worker holds its transaction open. If
// the second worker then waits for one of its row locks (both update the
// same row, or insert the same unique value), the kit sees it in pg_locks
// and lets the first resume, as a paused process eventually would: its
// commit is refused by the fence and rolls back, which frees the lock.
//
// The wire scenarios inject theirs through a FaultProxy per scenario. For
// other faults on the network (a reset of every connection, latency, a
// stall at a moment of your choosing), run any code through one yourself.
//
// # What it cannot see
//
// Start with a Check that counts (one order per key, one charge per order,
// the stock taken): most handler bugs are caught by it, not by the kit's
// own checks.
//
// The kit sees what the runner does: phases, commits, foreign calls made
// through Attempt.Foreign and the keys handed to them; of your tables, only
// the rows a write through the pool left behind after a rollback (see
// [BypassCheck]). It cannot see your providers. A call made outside
// Attempt.Foreign or with a key other than the one it was handed is only
// caught by a Config.Check that counts charges, or by a provider given in
// Config.Providers: give it every provider the flow can reach. A delete
// through the pool is caught only by a Check. It moves the runner's clock,
// which phases read with Attempt.Now, not the machine's. It builds the flow
// afresh for every simulated process only with Config.NewFlow, and never
// state kept elsewhere in the test process (a package-level map, a cache),
// which survives every simulated crash. It explores the
// path Input takes; explore each other path (a decline, a validation
// failure) with an Input that takes it. And it trusts a reconcile hook's
// verdict: a hook that says "not happened" about a message that was sent
// makes the runner send it again, which again only Check can notice.
//
// docs/testing.md in the repository walks through a failure report.
package idemtest
