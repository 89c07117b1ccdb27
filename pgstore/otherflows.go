package pgstore

import (
	"context"
	"fmt"

	"github.com/go-idem/idem/idemdriver"
)

var _ idemdriver.OtherFlowsCounter = (*Store)(nil)

// RunningKeysOfOtherFlows implements idemdriver.OtherFlowsCounter. "status
// <> 'finished'" matches the partial index idem_keys_unfinished, so it
// reads the few unfinished rows, never the finished millions.
func (s *Store) RunningKeysOfOtherFlows(ctx context.Context, known []string) ([]idemdriver.FlowKeys, error) {
	if known == nil {
		known = []string{}
	}
	sql := `SELECT flow::text AS flow, count(*)::int AS keys FROM ` + s.q.table + `
WHERE status <> 'finished' AND status = 'running' AND flow <> ALL($1::text[])
GROUP BY 1 ORDER BY 1`
	var groups []idemdriver.FlowKeys
	if err := selectAll(ctx, s.db, &groups, sql, known); err != nil {
		return nil, mapError(fmt.Errorf("pgstore: running keys of other flows: %w", err))
	}
	return groups, nil
}
