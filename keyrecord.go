package idem

import "github.com/go-idem/idem/idemdriver"

// KeyRecord is one persisted idempotency key: the request it guards, how far
// its flow got, the lease protecting it (see lock.go) and, once finished, the
// response. Phases see it read-only through [Attempt.Key]; operators see it
// through [Runner.GetKey], [Runner.ListKeys] and the CLI. It is defined in
// package idemdriver, which store implementations share with the runner.
type KeyRecord = idemdriver.KeyRecord

// Status is where a key stands in its life.
type Status = idemdriver.Status

const (
	// StatusRunning: the request has not produced its final response yet. The
	// key may be locked by a live worker, or unlocked waiting for a retry (or
	// the completer) to resume it from its recovery point.
	StatusRunning = idemdriver.StatusRunning
	// StatusFinished: a phase responded; the response is stored and every
	// retry replays it until the key expires.
	StatusFinished = idemdriver.StatusFinished
	// StatusNeedsReconcile: a not-idempotent foreign call may or may not have
	// happened. The key never re-executes by itself; a reconcile run asks the
	// flow's reconcile hook what the provider did.
	StatusNeedsReconcile = idemdriver.StatusNeedsReconcile
)

// The two recovery points every flow has. Between them, a key's recovery point
// is the name of the last phase that committed.
const (
	RecoveryPointStarted  = idemdriver.RecoveryPointStarted
	RecoveryPointFinished = idemdriver.RecoveryPointFinished
)

// RecoveryPointAbandoned is the recovery point of a finished key whose
// request an operator abandoned with [Runner.Resolve]: a retry with the key
// gets ErrRequestAbandoned.
const RecoveryPointAbandoned = idemdriver.RecoveryPointAbandoned

// Response is what a flow answers: a status, headers and the body bytes
// exactly as first sent.
type Response = idemdriver.Response
