package pgstore

import (
	"context"
	"fmt"

	"github.com/go-idem/idem/idemdriver"
)

var _ idemdriver.OtherFlowsCounter = (*Store)(nil)

// RunningKeysOfOtherFlows implements idemdriver.OtherFlowsCounter. It reads
// the unfinished window (unfinishedAmong), never the finished millions.
func (s *Store) RunningKeysOfOtherFlows(ctx context.Context, known []string) ([]idemdriver.FlowKeys, error) {
	if known == nil {
		known = []string{}
	}
	w, err := s.unfinished(ctx)
	if err != nil {
		return nil, err
	}
	sql := `SELECT flow::text AS flow, count(*)::int AS keys FROM ` + s.q.table + ` k
WHERE ` + unfinishedAmong("k", 2, 3) + ` AND status = 'running' AND flow <> ALL($1::text[])
GROUP BY 1 ORDER BY 1`
	var groups []idemdriver.FlowKeys
	if err := selectAll(ctx, s.db, &groups, sql, append([]any{known}, w.args()...)...); err != nil {
		return nil, mapError(fmt.Errorf("pgstore: running keys of other flows: %w", err))
	}
	return groups, nil
}
