package idemdriver

import (
	"context"

	"github.com/go-idem/idem/idemtype"
)

// VerdictStore keeps operators' verdicts. It is embedded in [Store].
type VerdictStore interface {
	// RecordVerdict inserts v in tx, the transaction that applies the
	// verdict to its key, so that the record lands if and only if the
	// verdict does. The store sets ID, SessionUser, ClientAddr and, when it
	// is zero, CreatedAt.
	RecordVerdict(ctx context.Context, tx PhaseTx, v *idemtype.Verdict) error
	// Verdicts returns the verdicts given on scope and key, over all its
	// generations and rows, oldest first.
	Verdicts(ctx context.Context, scope, key string) ([]idemtype.Verdict, error)
}
