package idemtype

import "time"

// Verdict is an operator's verdict on a key (idem.Runner.Resolve) as the
// store records it, for good: the record outlives the key, which names it by
// value (Scope, Key, KeyID, Generation), not by reference.
type Verdict struct {
	ID int64 `db:"id" json:"id"`
	// Scope, Key, KeyID and Generation name the key row the verdict was
	// given on; Fence is the fence the verdict held it with.
	Scope      string `db:"scope" json:"scope"`
	Key        string `db:"key" json:"key"`
	KeyID      int64  `db:"key_id" json:"key_id"`
	Generation int    `db:"generation" json:"generation"`
	Fence      int64  `db:"fence" json:"fence"`
	Flow       string `db:"flow" json:"flow"`
	// Verdict is "happened", "not_happened" or "abandon".
	Verdict string `db:"verdict" json:"verdict"`
	// Phase is the phase whose foreign call was in doubt ("" when none
	// was), ForeignKind its kind of call ("not_idempotent", "idempotent",
	// or "" when none or unknown), RecoveryPoint the key's recovery point
	// when the verdict was given.
	Phase         string `db:"phase" json:"phase,omitempty"`
	ForeignKind   string `db:"foreign_kind" json:"foreign_kind,omitempty"`
	RecoveryPoint string `db:"recovery_point" json:"recovery_point"`
	// Operator and Reason are who gave the verdict, as they named
	// themselves, and why; Action says what it did to the key.
	Operator string `db:"operator" json:"operator"`
	Reason   string `db:"reason" json:"reason"`
	Action   string `db:"action" json:"action"`
	// AnswerStatus and AnswerBytes describe the answer the verdict
	// finished the key with (nil when it gave none): its status and the
	// length of its body. The body is not kept, nor a hash of it: the
	// record outlives the key's retention, and a hash of a short body is
	// as good as the body to whoever can guess it.
	AnswerStatus *int `db:"answer_status" json:"answer_status,omitempty"`
	AnswerBytes  *int `db:"answer_bytes" json:"answer_bytes,omitempty"`
	// SessionUser and ClientAddr are set by the database: the role of the
	// session that wrote the record and the address it connected from
	// (empty over a Unix socket; a pooler's, behind one).
	SessionUser string    `db:"session_user_name" json:"session_user"`
	ClientAddr  string    `db:"client_addr" json:"client_addr,omitempty"`
	CreatedAt   time.Time `db:"created_at" json:"created_at"`
}
