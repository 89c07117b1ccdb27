package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
)

// Backlog implements idemdriver.Store.
func (s *Store) Backlog(ctx context.Context, p idemdriver.BacklogParams) (*idemtype.Backlog, error) {
	w, err := s.unfinished(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, s.q.backlog, append([]any{p.Now}, w.args()...)...)
	if err != nil {
		return nil, mapError(fmt.Errorf("pgstore: backlog: %w", err))
	}
	defer rows.Close()
	b := &idemtype.Backlog{}
	for rows.Next() {
		var st idemtype.StatusBacklog
		var oldest *time.Time
		if err := rows.Scan(&st.Status, &st.Keys, &oldest, &b.Now); err != nil {
			return nil, mapError(fmt.Errorf("pgstore: backlog: %w", err))
		}
		if oldest != nil {
			st.Oldest = *oldest
		}
		b.Statuses = append(b.Statuses, st)
	}
	if err := rows.Err(); err != nil {
		return nil, mapError(fmt.Errorf("pgstore: backlog: %w", err))
	}
	return b, nil
}
