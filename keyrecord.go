package idem

import (
	"encoding/json"
	"net/http"
	"time"
)

// Status is where a key stands in its life.
type Status string

const (
	// StatusRunning: the request has not produced its final response yet. The
	// key may be locked by a live worker, or unlocked waiting for a retry (or
	// the completer) to resume it from its recovery point.
	StatusRunning Status = "running"
	// StatusFinished: a phase responded; the response is stored and every
	// retry replays it until the key expires.
	StatusFinished Status = "finished"
	// StatusNeedsReconcile: a not-idempotent foreign call may or may not have
	// happened. The key never re-executes by itself; a reconcile run asks the
	// flow's reconcile hook what the provider did.
	StatusNeedsReconcile Status = "needs_reconcile"
)

// The two recovery points every flow has. Between them, a key's recovery point
// is the name of the last phase that committed.
const (
	RecoveryPointStarted  = "started"
	RecoveryPointFinished = "finished"
)

// KeyRecord is one persisted idempotency key: the request it guards, how far
// its flow got, the lease protecting it and, once finished, the response.
// Phases see it read-only through [Attempt.Key]; operators see it through the
// store and the CLI.
type KeyRecord struct {
	ID int64 `db:"id" json:"id"`
	// RequestID is a random UUID, unique per key row; downstream idempotency
	// keys are derived from it.
	RequestID string `db:"request_id" json:"request_id"`
	Scope     string `db:"scope" json:"scope"`
	Key       string `db:"key" json:"key"`
	Flow      string `db:"flow" json:"flow"`
	Method    string `db:"method" json:"method"`
	Path      string `db:"path" json:"path"`
	// Fingerprint is SHA-256 over the flow name and the canonical JSON of the
	// input; see [Fingerprint].
	Fingerprint []byte `db:"fingerprint" json:"fingerprint"`
	// Params is the input as JSON, kept so the request can be re-driven
	// server-side without the client.
	Params json.RawMessage `db:"params" json:"params"`

	Status        Status `db:"status" json:"status"`
	RecoveryPoint string `db:"recovery_point" json:"recovery_point"`
	// Checkpoint is what committed phases recorded for later ones.
	Checkpoint map[string]json.RawMessage `db:"checkpoint" json:"checkpoint"`
	// ForeignMark names the phase whose not-idempotent foreign call was
	// attempted without the phase committing; empty otherwise.
	ForeignMark string `db:"foreign_mark" json:"foreign_mark,omitempty"`

	LockedAt       *time.Time `db:"locked_at" json:"locked_at"`
	LeaseExpiresAt *time.Time `db:"lease_expires_at" json:"lease_expires_at"`
	// Fence is the fencing token: it grows on every acquisition and forced
	// unlock, and a phase commits only while it still matches.
	Fence int64 `db:"fence" json:"fence"`

	ResponseStatus  int         `db:"response_status" json:"response_status,omitempty"`
	ResponseHeaders http.Header `db:"response_headers" json:"response_headers,omitempty"`
	ResponseBody    []byte      `db:"response_body" json:"response_body,omitempty"`

	Attempts   int        `db:"attempts" json:"attempts"`
	LastError  string     `db:"last_error" json:"last_error,omitempty"`
	CreatedAt  time.Time  `db:"created_at" json:"created_at"`
	LastRunAt  time.Time  `db:"last_run_at" json:"last_run_at"`
	FinishedAt *time.Time `db:"finished_at" json:"finished_at"`
	ExpiresAt  *time.Time `db:"expires_at" json:"expires_at"`
}

// Locked reports whether a live lease holds the key at time now.
func (k *KeyRecord) Locked(now time.Time) bool {
	return k.LockedAt != nil && k.LeaseExpiresAt != nil && k.LeaseExpiresAt.After(now)
}

// Response returns the stored response of a finished key, nil otherwise.
func (k *KeyRecord) Response() *Response {
	if k.Status != StatusFinished {
		return nil
	}
	return &Response{Status: k.ResponseStatus, Header: k.ResponseHeaders.Clone(), Body: append([]byte(nil), k.ResponseBody...)}
}

func (k *KeyRecord) clone() *KeyRecord {
	c := *k
	c.Checkpoint = make(map[string]json.RawMessage, len(k.Checkpoint))
	for n, v := range k.Checkpoint {
		c.Checkpoint[n] = v
	}
	return &c
}
