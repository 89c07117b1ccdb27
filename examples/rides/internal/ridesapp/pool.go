package ridesapp

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem/pgstore"
)

// ParsePoolConfig parses databaseURL into a pool configuration and says
// whether it reaches Postgres through a connection pooler, which it asks on
// one connection: a pooler announces a backend pid of its own making, not
// the server's pg_backend_pid(). Behind a pooler the configuration sends no
// cancel requests (SendNoCancelRequests).
func ParsePoolConfig(ctx context.Context, databaseURL string) (*pgxpool.Config, bool, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, false, fmt.Errorf("rides: database URL: %w", err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig.Copy())
	if err != nil {
		return nil, false, fmt.Errorf("rides: connect to the database: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	pooled, err := pgstore.BehindPooler(ctx, conn)
	if err != nil {
		return nil, false, fmt.Errorf("rides: %w", err)
	}
	if pooled {
		SendNoCancelRequests(cfg.ConnConfig)
	}
	return cfg, pooled, nil
}

// SendNoCancelRequests makes cfg's connections drop the cancel requests pgx
// sends when a statement's context ends mid-statement (pgx v5 sends one
// whichever context watcher handler is set, as it closes the interrupted
// connection). A cancel request is a connection of its own, and PgBouncer
// 1.18 exits (pgbouncer#801, fixed upstream by pgbouncer#846) when that connection goes
// away before the bouncer forwarded it: a process killed or stopping, a
// client that gives up. Without it the interrupted statement runs on to
// its end (statement_timeout bounds it) on a server connection the pooler
// then closes, since its client has left.
func SendNoCancelRequests(cfg *pgx.ConnConfig) {
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &cancelDropper{Conn: conn}, nil
	}
}

// cancelDropper is a connection that closes itself instead of sending a
// CancelRequest packet as its first message. The pooler sees a client
// leave before saying anything.
type cancelDropper struct {
	net.Conn
	wrote bool
}

func (c *cancelDropper) Write(p []byte) (int, error) {
	first := !c.wrote
	c.wrote = true
	if first && isCancelRequest(p) {
		_ = c.Conn.Close()
		return len(p), nil // pgx then reads the closed connection's end
	}
	return c.Conn.Write(p)
}

// isCancelRequest says whether p is a CancelRequest packet: its length,
// then the code 80877102, the backend pid and its secret key.
func isCancelRequest(p []byte) bool {
	return len(p) >= 8 && binary.BigEndian.Uint32(p) == uint32(len(p)) && binary.BigEndian.Uint32(p[4:]) == 80877102
}
