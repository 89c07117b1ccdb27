package idemtype

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// StoredStatus is the status column of a key: where it stands in its life as
// the store records it. Operators see its [KeyState] instead, which refines
// it by the lease and the expiry: a StoredRunning key is KeyStateRunning
// while a live lease holds it and KeyStateStale otherwise.
type StoredStatus string

const (
	// StoredRunning: the request has not produced its final response yet. The
	// key may be locked by a live worker, or unlocked waiting for a retry (or
	// the completer) to resume it from its recovery point.
	StoredRunning StoredStatus = "running"
	// StoredFinished: a phase responded; the response is stored and every
	// retry replays it until the key expires.
	StoredFinished StoredStatus = "finished"
	// StoredNeedsReconcile: a not-idempotent foreign call may or may not have
	// happened. The key never re-executes by itself; a reconcile run asks the
	// flow's reconcile hook what the provider did.
	StoredNeedsReconcile StoredStatus = "needs_reconcile"
)

// The two recovery points every flow has. Between them, a key's recovery point
// is the name of the last phase that committed.
const (
	RecoveryPointStarted  = "started"
	RecoveryPointFinished = "finished"
)

// RecoveryPointAbandoned is the recovery point of a finished key whose
// request an operator abandoned (idem.Runner.Resolve): its retries get
// idem.ErrRequestAbandoned rather than a replay of the placeholder response
// stored with it. It cannot be a phase name, which has no hyphen.
const RecoveryPointAbandoned = "abandoned-by-operator"

// KeyRecord is one persisted idempotency key: the request it guards, how far
// its flow got, the lease protecting it and, once finished, the response.
// Phases see it read-only through idem.Attempt.Key; operators see it through
// the store and the CLI.
type KeyRecord struct {
	ID     int64  `db:"id" json:"id"`
	Scope  string `db:"scope" json:"scope"`
	Key    string `db:"key" json:"key"`
	Flow   string `db:"flow" json:"flow"`
	Method string `db:"method" json:"method"`
	Path   string `db:"path" json:"path"`
	// Fingerprint identifies the request the key was created for: 33
	// bytes, the scheme byte 2 and SHA-256 (HMAC-SHA-256 with a fingerprint
	// key) over the flow, the request target and what the client sent
	// (idem's fingerprint.go). Downstream keys derive from it. A key that
	// v0.1.0 finished holds v0.1.0's fingerprint instead (see FromV01).
	Fingerprint []byte `db:"fingerprint" json:"fingerprint"`
	// Params is the input as JSON (or what the flow's FlowConfig.Store
	// keeps of it), kept so the request can be re-driven server-side
	// without the client. It is always the plain JSON once read, however it
	// is stored. Records that carry no payload leave it nil: a finished
	// key's from idemdriver.Store.Acquire (and so idem.Outcome.Record of a
	// replay), and listings and claims without it (see
	// idemdriver.Store.ListKeys and ClaimIdle).
	Params json.RawMessage `db:"params" json:"params"`
	// ParamsKeyID names the key of the store's keyring that seals Params at
	// rest (pgstore.Config.Keyring); empty when it is stored in the clear.
	ParamsKeyID string `db:"params_key_id" json:"params_key_id,omitempty"`

	Status        StoredStatus `db:"status" json:"status"`
	RecoveryPoint string       `db:"recovery_point" json:"recovery_point"`
	// Checkpoint is what committed phases recorded for later ones; nil
	// where Params is.
	Checkpoint map[string]json.RawMessage `db:"checkpoint" json:"checkpoint"`
	// ForeignMark names the phase whose not-idempotent foreign call was
	// attempted without the phase committing; empty otherwise.
	ForeignMark string `db:"foreign_mark" json:"foreign_mark,omitempty"`

	LockedAt       *time.Time `db:"locked_at" json:"locked_at"`
	LeaseExpiresAt *time.Time `db:"lease_expires_at" json:"lease_expires_at"`
	// Fence is the fencing token: it grows on every acquisition and forced
	// unlock, and a phase commits only while it still matches.
	Fence int64 `db:"fence" json:"fence"`
	// HolderInstance, HolderHost, HolderPID and HolderBoot name the process
	// that took the key's current lease (see pgstore.Config.Instance): its
	// instance name (empty when the application names none), host, process
	// id and boot id. They are empty for a finished key, and for a lease
	// taken by a version that did not record its holder. A lease that is
	// released or expired still names its last holder.
	HolderInstance string `db:"holder_instance" json:"holder_instance,omitempty"`
	HolderHost     string `db:"holder_host" json:"holder_host,omitempty"`
	HolderPID      int    `db:"holder_pid" json:"holder_pid,omitempty"`
	HolderBoot     string `db:"holder_boot" json:"holder_boot,omitempty"`

	ResponseStatus  int         `db:"response_status" json:"response_status,omitempty"`
	ResponseHeaders http.Header `db:"response_headers" json:"response_headers,omitempty"`
	ResponseBody    []byte      `db:"response_body" json:"response_body,omitempty"`
	// ResponseKeyID is ParamsKeyID for ResponseBody.
	ResponseKeyID string `db:"response_key_id" json:"response_key_id,omitempty"`
	// Generation counts the requests this scope and key carried before this
	// one: 0 for a key never seen, one more than the expired key's when a
	// request with the key replaced an expired one. Downstream keys hash it
	// in when it is not 0 (see DownstreamKey).
	Generation int `db:"generation" json:"generation,omitempty"`

	Attempts int `db:"attempts" json:"attempts"`
	// LastError is why the key's last attempt did not finish (a phase's
	// error, a reconcile hook's "unknown", an operator's unlock reason);
	// the commit that finishes the key clears it.
	LastError  string     `db:"last_error" json:"last_error,omitempty"`
	CreatedAt  time.Time  `db:"created_at" json:"created_at"`
	LastRunAt  time.Time  `db:"last_run_at" json:"last_run_at"`
	FinishedAt *time.Time `db:"finished_at" json:"finished_at"`
	ExpiresAt  *time.Time `db:"expires_at" json:"expires_at"`
}

// DownstreamKey is the idempotency key the foreign call of the given phase
// sends to its provider (idem.Attempt.IdempotencyKey). It is derived from the
// request itself: "idem-" and 32 hex digits of SHA-256 over the scope, key,
// flow, fingerprint and phase, and the key's Generation when it is not 0,
// each length-prefixed so no two requests collide by shifting bytes between
// fields. So it is stable across retries, crashes and takeovers, distinct
// per phase, and the same after the key row is lost and re-created (a
// failover to a standby that had not received it comes back with the same
// generation): the provider recognises the retry. A request that reuses the
// key after it expired is a new request, one generation on, and sends new
// keys, so a provider that still remembers the old ones does not answer it
// with the old request's result. (A key reused after the reaper deleted its
// expired row starts at generation 0 again: keep Retention at least as long
// as your providers remember their idempotency keys, or have clients never
// reuse one.) Hashing keeps tenant data from providers.
func (k *KeyRecord) DownstreamKey(phase string) string {
	sum := sha256.New()
	fields := [][]byte{[]byte(k.Scope), []byte(k.Key), []byte(k.Flow), k.Fingerprint, []byte(phase)}
	if k.Generation != 0 {
		fields = append(fields, []byte(strconv.Itoa(k.Generation)))
	}
	for _, field := range fields {
		fmt.Fprintf(sum, "%d:", len(field))
		sum.Write(field)
	}
	return "idem-" + hex.EncodeToString(sum.Sum(nil)[:16])
}

// SameRequest reports whether a request with these fingerprints (see
// idemdriver.AcquireParams.Fingerprints) is the one the key was created for, flow,
// method and path aside.
func (k *KeyRecord) SameRequest(fingerprints [][]byte) bool {
	return slices.ContainsFunc(fingerprints, func(fp []byte) bool { return bytes.Equal(k.Fingerprint, fp) })
}

// FromV01 reports whether v0.1.0 finished the key: its fingerprint is
// v0.1.0's (32 bytes, over the decoded input), which this release does not
// compute. Migration 0007 takes only finished keys from v0.1.0, and the
// runner replays such a key to a retry with the same flow, method and path
// without comparing fingerprints, for as long as it is retained. Delete in
// v0.3.
func (k *KeyRecord) FromV01() bool {
	return k.Status == StoredFinished && len(k.Fingerprint) == sha256.Size
}

// Locked reports whether a live lease holds the key at time now.
func (k *KeyRecord) Locked(now time.Time) bool {
	return k.LockedAt != nil && k.LeaseExpiresAt != nil && k.LeaseExpiresAt.After(now)
}

// Response returns the stored response of a finished key, nil otherwise.
func (k *KeyRecord) Response() *Response {
	if k.Status != StoredFinished {
		return nil
	}
	return &Response{Status: k.ResponseStatus, Header: k.ResponseHeaders.Clone(), Body: append([]byte(nil), k.ResponseBody...)}
}

// Clone returns a copy that shares nothing mutable with k.
func (k *KeyRecord) Clone() *KeyRecord {
	c := *k
	c.Checkpoint = make(map[string]json.RawMessage, len(k.Checkpoint))
	for n, v := range k.Checkpoint {
		c.Checkpoint[n] = v
	}
	return &c
}

// Response is what a flow answers: a status, headers and the body bytes
// exactly as first sent.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// KeyState is how an operator sees a key: its [StoredStatus] refined by its
// lease and its expiry. [KeyRecord.State] computes it; the CLI's and
// [KeyQuery]'s state filters take it.
type KeyState string

const (
	// KeyStateRunning: unfinished and held by a live lease; a worker is on it.
	KeyStateRunning KeyState = "running"
	// KeyStateStale: unfinished and nobody holds it (released after a failed
	// attempt, or its holder died and the lease expired). The next client
	// retry, or the completer, resumes it; past its flow's UnfinishedRetention
	// the reaper deletes it.
	KeyStateStale KeyState = "stale"
	// KeyStateFinished: a response is stored and is replayed until expiry.
	KeyStateFinished KeyState = "finished"
	// KeyStateNeedsReconcile: waits for a reconcile run to decide whether a
	// not-idempotent foreign call happened.
	KeyStateNeedsReconcile KeyState = "needs_reconcile"
	// KeyStateExpired: finished and past expires_at. It is never replayed:
	// a request with the key runs as a new request and replaces it, and the
	// reaper deletes it.
	KeyStateExpired KeyState = "expired"
)

// KeyStates lists every KeyState, in the order a key usually goes through
// them.
func KeyStates() []KeyState {
	return []KeyState{KeyStateRunning, KeyStateStale, KeyStateNeedsReconcile, KeyStateFinished, KeyStateExpired}
}

// ParseKeyState parses a state name as the CLI accepts it. The old spelling
// "needs-reconcile" is still accepted for "needs_reconcile".
func ParseKeyState(s string) (KeyState, error) {
	if s == "needs-reconcile" {
		return KeyStateNeedsReconcile, nil
	}
	for _, st := range KeyStates() {
		if string(st) == s {
			return st, nil
		}
	}
	return "", fmt.Errorf("unknown key state %q (running, stale, needs_reconcile, finished or expired)", s)
}

// State classifies the key at time now (use the database clock where you
// have it, as [KeyList.Now]).
func (k *KeyRecord) State(now time.Time) KeyState {
	switch k.Status {
	case StoredFinished:
		if k.ExpiresAt != nil && !k.ExpiresAt.After(now) {
			return KeyStateExpired
		}
		return KeyStateFinished
	case StoredNeedsReconcile:
		return KeyStateNeedsReconcile
	}
	if k.Locked(now) {
		return KeyStateRunning
	}
	return KeyStateStale
}

// KeyQuery selects keys for idem.Runner.ListKeys. Zero fields do not filter,
// except that the runner needs a Scope or AllScopes.
type KeyQuery struct {
	State KeyState
	// Scope lists the keys of one scope (tenant). idem.Runner.ListKeys
	// needs it, or AllScopes: scopes are tenants, and a listing across them
	// is asked for explicitly.
	Scope string
	// AllScopes lists the keys of every scope; it excludes Scope.
	AllScopes bool
	Key       string
	Flow      string
	// ID lists only the key with this row id (KeyRecord.ID, the key_id of
	// log lines), when positive.
	ID int64
	// Reveal returns each key's payload too: its input (Params), its
	// checkpoint data and its response's headers and body. Without it they
	// are left empty, and a store that seals them at rest needs no key to
	// list the rest.
	Reveal bool
	// Limit caps the number of keys returned: default 50, at most
	// MaxKeyListLimit.
	Limit int
	// BeforeID pages backwards: only keys with a smaller id are returned.
	// Pass the last id of the previous page.
	BeforeID int64
}

// MaxKeyListLimit is the most keys one ListKeys call returns.
const MaxKeyListLimit = 10000

// KeyList is a page of keys and the database clock it was read at, against
// which [KeyRecord.State] classifies them.
type KeyList struct {
	Keys []*KeyRecord
	Now  time.Time
}
