package pgstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
)

// verdictsTable is idem_verdicts in the store's schema (migration 0007).
// It is derived from the keys table's qualified name, which carries the
// schema's prefix.
func (s *Store) verdictsTable() string {
	return strings.TrimSuffix(s.q.table, "idem_keys") + "idem_verdicts"
}

// verdictColumns are idem_verdicts' columns as Verdict scans them.
const verdictColumns = `id, scope, key, key_id, generation, fence, flow, verdict, phase, foreign_kind, recovery_point,
    operator, reason, action, answer_status, answer_bytes, session_user_name,
    coalesce(host(client_addr), '') AS client_addr, created_at`

// RecordVerdict implements idemdriver.VerdictStore: an INSERT in the
// verdict's own transaction, which the database stamps with the session's
// role and client address. It names the scope, so that on Citus it runs on
// the worker of the key's row.
func (s *Store) RecordVerdict(ctx context.Context, tx idemdriver.PhaseTx, v *idemtype.Verdict) error {
	sql := `INSERT INTO ` + s.verdictsTable() + ` (scope, key, key_id, generation, fence, flow, verdict, phase, foreign_kind,
    recovery_point, operator, reason, action, answer_status, answer_bytes, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, coalesce($16::timestamptz, now()))
RETURNING id, session_user_name, coalesce(host(client_addr), ''), created_at`
	var at any
	if !v.CreatedAt.IsZero() {
		at = v.CreatedAt
	}
	err := tx.QueryRow(ctx, sql, v.Scope, v.Key, v.KeyID, v.Generation, v.Fence, v.Flow, v.Verdict, v.Phase, v.ForeignKind,
		v.RecoveryPoint, v.Operator, v.Reason, v.Action, v.AnswerStatus, v.AnswerBytes, at).
		Scan(&v.ID, &v.SessionUser, &v.ClientAddr, &v.CreatedAt)
	if err != nil {
		return mapError(fmt.Errorf("pgstore: record the verdict: %w", err))
	}
	return nil
}

// Verdicts implements idemdriver.VerdictStore.
func (s *Store) Verdicts(ctx context.Context, scope, key string) ([]idemtype.Verdict, error) {
	var out []idemtype.Verdict
	sql := `SELECT ` + verdictColumns + ` FROM ` + s.verdictsTable() + ` WHERE scope = $1 AND key = $2 ORDER BY created_at, id`
	if err := selectAll(ctx, s.control, &out, sql, scope, key); err != nil {
		return nil, mapError(fmt.Errorf("pgstore: read verdicts: %w", err))
	}
	return out, nil
}
