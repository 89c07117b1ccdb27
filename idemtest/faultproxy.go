package idemtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/go-idem/idem/internal/pgproxy"
)

// FaultProxy is a TCP proxy in front of Postgres that injects network
// faults: a reply lost after the server executed the command, a stall, a
// reset, latency. [Explore] injects faults through the runner's hooks, which
// is exact but only sees what the runner does; the proxy injects them
// where they happen in production, between the process and the database,
// so a test can check what any code path (a flow, a pool, a maintainer, a
// handler) does when the network fails at one precise round trip.
//
// The proxy reads the Postgres protocol with pgx's pgproto3, to count round
// trips and match them, and forwards every message unchanged. A round trip
// is a simple Query, or a group of extended-protocol messages ending with
// Sync (a pgx batch, with all its statements, is one), or a FunctionCall;
// its reply ends with the server's ReadyForQuery. Password authentication
// (SCRAM, MD5, cleartext) and cancel requests are relayed. The proxy refuses SSL
// and GSS encryption on the server's behalf, to keep the stream readable:
// connect with sslmode=disable (URL sets it) or prefer.
//
// Faults are armed with a Rule (LoseReply, StallReply) or applied at once
// (Stall, ResetAll, SetLatency). A FaultProxy is safe for concurrent use.
// Close it when done: it ends every connection and goroutine it started.
type FaultProxy struct {
	p *pgproxy.Proxy
}

// StartFaultProxy starts a proxy listening on 127.0.0.1 on a free port and
// forwarding to target: a host:port, or a postgres:// URL whose host and
// port are used. It only listens; connections to the target are made when
// clients connect. ctx bounds the start only; the proxy runs until Close.
func StartFaultProxy(ctx context.Context, target string) (*FaultProxy, error) {
	target, err := proxyTarget(target)
	if err != nil {
		return nil, err
	}
	p, err := pgproxy.Start(ctx, target)
	if err != nil {
		return nil, fmt.Errorf("idemtest: fault proxy: %w", err)
	}
	return &FaultProxy{p: p}, nil
}

// Addr is the address clients connect to, "127.0.0.1:port".
func (p *FaultProxy) Addr() string { return p.p.Addr() }

// URL returns base, a postgres:// URL of the target, pointed at the proxy:
// the same user, password, database and parameters, with the host and port
// replaced, host, hostaddr and port parameters and TLS settings removed,
// and sslmode=disable, because the proxy must read the stream.
func (p *FaultProxy) URL(base string) (string, error) {
	u, err := parsePostgresURL(base)
	if err != nil {
		return "", err
	}
	u.Host = p.Addr()
	q := u.Query()
	for _, name := range []string{"host", "hostaddr", "port", "sslnegotiation", "sslrootcert", "sslcert", "sslkey", "sslpassword", "sslsni"} {
		q.Del(name)
	}
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// Commands returns how many round trips clients have sent through the proxy
// since it started. Read it before and after a request to learn how many
// round trips the request takes, then target each with Rule.Nth.
func (p *FaultProxy) Commands() int64 { return p.p.Commands() }

// SetLatency delays the reply to every round trip by d from now on, as a
// slow network would; zero turns it off. Startup and authentication are
// not delayed.
func (p *FaultProxy) SetLatency(d time.Duration) {
	p.p.SetLatency(d)
}

// Stall holds all traffic, both ways, on every connection, as a network
// partition does: nothing is dropped, and nothing more is delivered until
// Resume. New connections are accepted and held too. Clients see it only
// as silence: their deadlines, keepalives and lock timeouts decide what
// happens.
func (p *FaultProxy) Stall() {
	p.p.Stall()
}

// Resume ends a stall (from Stall or a StallReply fault): everything held
// is delivered, in order, on the connections that are still open.
func (p *FaultProxy) Resume() {
	p.p.Resume()
}

// ResetAll resets every open connection, client and server side, with a
// TCP RST, as a restarted load balancer or a failover does: a client sees
// its connection reset at once, whatever it was doing, and the server rolls
// back what was not committed. New connections are unaffected. It returns
// how many connections it reset.
func (p *FaultProxy) ResetAll() int {
	return p.p.ResetAll()
}

// Close stops listening and closes every connection, and returns once
// every goroutine of the proxy has ended. Calling it again is a no-op.
func (p *FaultProxy) Close() error {
	if err := p.p.Close(); err != nil {
		return fmt.Errorf("idemtest: fault proxy: %w", err)
	}
	return nil
}

// Rule says which round trips a fault acts on. The fields that are set
// must all hold. Round trips count from when the fault is armed, across
// all the proxy's connections, in the order their replies arrive; one sent
// before arming never matches.
//
// A fault acts on a round trip's reply at its first message that reports an
// outcome (CommandComplete, ErrorResponse, EmptyQueryResponse,
// ReadyForQuery...), or, with Tag, at the CommandComplete with that tag.
// So the server has executed the command when the fault acts; what came
// before in the reply (parse and bind acknowledgements, rows, earlier
// statements' results) has been forwarded already, and nothing after it
// will be. Postgres sends results when a round trip ends (or its output
// buffer fills, or a notice goes out), so a fault matched early in a
// multi-statement round trip usually sees the whole round trip executed.
// The zero Rule matches the next round trip.
type Rule struct {
	// Nth makes the fault act on the Nth round trip that matches the other
	// fields, skipping the ones before. 0 means 1.
	Nth int
	// Tag matches a round trip whose reply has a CommandComplete tag that
	// begins with Tag, ignoring case: "COMMIT", "INSERT", "UPDATE 1". A
	// commit that fails is answered ROLLBACK, so Tag "COMMIT" matches only
	// commits that succeeded.
	Tag string
	// SQL matches a round trip that executes a statement whose text
	// contains SQL (case-sensitive): the text of a simple Query, or of the
	// prepared statement a Bind executes, however long ago the connection
	// prepared it. A round trip that only prepares or describes a
	// statement executes nothing and does not match. Only the first MiB of
	// a statement's text is searched.
	SQL string
	// Times is how many matching round trips the fault acts on, from the
	// Nth on. 0 means 1.
	Times int
}

// LoseReply arms a fault that loses the reply to round trips matching
// rule: the server executes the command, the proxy reads the rest of the
// reply up to ReadyForQuery so that the server has finished the round trip,
// discards it, and resets the client's connection (TCP RST). The client
// sees a broken connection and cannot tell whether the command ran: the
// lost COMMIT acknowledgement that idempotency keys exist for. The server
// side is closed, so a transaction left open rolls back.
func (p *FaultProxy) LoseReply(rule Rule) *Fault {
	return &Fault{p.p.LoseReply(pgproxy.Rule(rule))}
}

// StallReply arms a fault that stalls the proxy, as Stall does, when a
// round trip matching rule gets its reply: the server has executed the
// command, the client is left waiting for the answer, until Resume. Use it
// to hold a worker at an exact point ("round trip N has run") while the
// test does something else.
func (p *FaultProxy) StallReply(rule Rule) *Fault {
	return &Fault{p.p.StallReply(pgproxy.Rule(rule))}
}

// Fault is an armed fault, returned by LoseReply and StallReply, for a test
// to learn that it fired (Done, Fired) or to disarm it.
type Fault struct {
	f *pgproxy.Fault
}

// Done is closed once the fault has acted on as many round trips as its
// Rule.Times says. A test waits on it instead of sleeping.
func (f *Fault) Done() <-chan struct{} { return f.f.Done() }

// Fired returns how many round trips the fault has acted on so far.
func (f *Fault) Fired() int { return f.f.Fired() }

// Disarm removes the fault if it is still armed: it acts on no further
// round trip, and Done stays open if it had not fired enough.
func (f *Fault) Disarm() { f.f.Disarm() }

// proxyTarget turns StartFaultProxy's target into host:port.
func proxyTarget(target string) (string, error) {
	if strings.Contains(target, "://") {
		u, err := parsePostgresURL(target)
		if err != nil {
			return "", err
		}
		q := u.Query()
		if u.Host == "" || strings.Contains(u.Host, ",") || q.Has("host") || q.Has("hostaddr") {
			return "", errors.New("idemtest: fault proxy: the target URL must name exactly one TCP host (no sockets, lists or host parameters)")
		}
		target = u.Host
		if u.Port() == "" {
			target = net.JoinHostPort(u.Hostname(), "5432")
		}
	}
	if _, _, err := net.SplitHostPort(target); err != nil {
		// Not quoted: a keyword/value connection string would show its password.
		return "", errors.New("idemtest: fault proxy: the target is not host:port or a postgres:// URL")
	}
	return target, nil
}

func parsePostgresURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		// A *url.Error repeats the URL, password included: keep the reason.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("idemtest: fault proxy: cannot parse the database URL: %w", err)
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return nil, fmt.Errorf("idemtest: fault proxy: not a postgres:// URL (scheme %q)", u.Scheme)
	}
	return u, nil
}
