package pgtest

import (
	"context"
	"encoding/binary"
	"net"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// CountCancelRequests makes cfg's connections count the cancel requests
// they send: a connection whose first write is a CancelRequest packet.
// pgx sends one, on a connection of its own, when a statement's context
// ends mid-statement; through PgBouncer 1.18 that can make the bouncer exit
// (pgbouncer#801).
func CountCancelRequests(cfg *pgx.ConnConfig) *atomic.Int64 {
	var n atomic.Int64
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &cancelSpotter{Conn: conn, count: &n}, nil
	}
	return &n
}

type cancelSpotter struct {
	net.Conn
	count *atomic.Int64
	wrote bool
}

func (c *cancelSpotter) Write(p []byte) (int, error) {
	// CancelRequest: length 16, then the code 80877102.
	if !c.wrote && len(p) >= 8 && binary.BigEndian.Uint32(p) == 16 && binary.BigEndian.Uint32(p[4:]) == 80877102 {
		c.count.Add(1)
	}
	c.wrote = true
	return c.Conn.Write(p)
}
