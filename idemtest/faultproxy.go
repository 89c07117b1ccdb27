package idemtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// dialTimeout bounds connecting to the target, so a client of a proxy whose
// target is gone gets an error rather than a hang.
const dialTimeout = 30 * time.Second

// FaultProxy is a TCP proxy in front of Postgres that injects network
// faults: a reply lost after the server executed the command, a stall, a
// reset, latency. [Explore] injects faults through the runner's hooks, which
// is exact but only sees what the runner does; the proxy injects them
// where they happen in production, between the process and the database,
// so a test can check what any code path (a flow, a pool, a maintainer, a
// handler) does when the network fails at one precise round trip.
//
// The proxy understands the Postgres protocol enough to count round trips
// and match them, and forwards every byte unchanged. A round trip is a
// simple Query, or a group of extended-protocol messages ending with Sync
// (a pgx batch, with all its statements, is one), or a FunctionCall; its
// reply ends with the server's ReadyForQuery. Authentication, whatever the
// method, and cancel requests are relayed untouched. The proxy refuses SSL
// and GSS encryption on the server's behalf, to keep the stream readable:
// connect with sslmode=disable (URL sets it) or prefer.
//
// Faults are armed with a Rule (LoseReply, StallReply) or applied at once
// (Stall, ResetAll, SetLatency). A FaultProxy is safe for concurrent use.
// Close it when done: it ends every connection and goroutine it started.
type FaultProxy struct {
	target string
	ln     net.Listener
	ctx    context.Context // cancelled by Close: ends dials, waits and connections
	cancel context.CancelFunc
	wg     sync.WaitGroup // the accept loop and every connection's goroutines

	commands atomic.Int64 // round trips sent, ever
	latency  atomic.Int64 // a time.Duration added to every reply
	armed    atomic.Int32 // len(faults), read without the lock on the hot path

	mu      sync.Mutex
	closed  bool
	conns   map[*proxyConn]struct{}
	faults  []*Fault      // armed, in arming order
	stalled chan struct{} // non-nil while stalled; closed by Resume
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
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("idemtest: fault proxy: listen: %w", err)
	}
	pctx, cancel := context.WithCancel(context.Background())
	p := &FaultProxy{
		target: target,
		ln:     ln,
		ctx:    pctx,
		cancel: cancel,
		conns:  make(map[*proxyConn]struct{}),
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients connect to, "127.0.0.1:port".
func (p *FaultProxy) Addr() string { return p.ln.Addr().String() }

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
func (p *FaultProxy) Commands() int64 { return p.commands.Load() }

// SetLatency delays the reply to every round trip by d from now on, as a
// slow network would; zero turns it off. Startup and authentication are
// not delayed.
func (p *FaultProxy) SetLatency(d time.Duration) {
	p.latency.Store(int64(max(d, 0)))
}

// Stall holds all traffic, both ways, on every connection, as a network
// partition does: nothing is dropped, and nothing more is delivered until
// Resume. New connections are accepted and held too. Clients see it only
// as silence: their deadlines, keepalives and lock timeouts decide what
// happens.
func (p *FaultProxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
}

// Resume ends a stall (from Stall or a StallReply fault): everything held
// is delivered, in order, on the connections that are still open.
func (p *FaultProxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
}

// ResetAll resets every open connection, client and server side, with a
// TCP RST, as a restarted load balancer or a failover does: a client sees
// its connection reset at once, whatever it was doing, and the server rolls
// back what was not committed. New connections are unaffected. It returns
// how many connections it reset.
func (p *FaultProxy) ResetAll() int {
	p.mu.Lock()
	conns := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	n := 0
	for _, c := range conns {
		if c.shutdown(endReset) {
			n++
		}
	}
	return n
}

// Close stops listening and closes every connection, and returns once
// every goroutine of the proxy has ended. Calling it again is a no-op.
func (p *FaultProxy) Close() error {
	p.mu.Lock()
	first := !p.closed
	p.closed = true
	conns := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	var err error
	if first {
		p.cancel()
		if err = p.ln.Close(); errors.Is(err, net.ErrClosed) {
			err = nil
		}
		for _, c := range conns {
			c.shutdown(endClose)
		}
	}
	p.wg.Wait()
	return err
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
func (p *FaultProxy) LoseReply(rule Rule) *Fault { return p.arm(faultLose, rule) }

// StallReply arms a fault that stalls the proxy, as Stall does, when a
// round trip matching rule gets its reply: the server has executed the
// command, the client is left waiting for the answer, until Resume. Use it
// to hold a worker at an exact point ("round trip N has run") while the
// test does something else.
func (p *FaultProxy) StallReply(rule Rule) *Fault { return p.arm(faultStall, rule) }

// Fault is an armed fault, returned by LoseReply and StallReply, for a test
// to learn that it fired (Done, Fired) or to disarm it.
type Fault struct {
	p     *FaultProxy
	kind  faultKind
	rule  Rule
	after int64 // Commands() when armed: earlier round trips never match
	done  chan struct{}

	// Guarded by p.mu.
	skip  int // matching round trips still to let through
	times int
	fired int
}

type faultKind int

const (
	faultLose faultKind = iota
	faultStall
)

// Done is closed once the fault has acted on as many round trips as its
// Rule.Times says. A test waits on it instead of sleeping.
func (f *Fault) Done() <-chan struct{} { return f.done }

// Fired returns how many round trips the fault has acted on so far.
func (f *Fault) Fired() int {
	f.p.mu.Lock()
	defer f.p.mu.Unlock()
	return f.fired
}

// Disarm removes the fault if it is still armed: it acts on no further
// round trip, and Done stays open if it had not fired enough.
func (f *Fault) Disarm() {
	p := f.p
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, g := range p.faults {
		if g == f {
			p.faults = append(p.faults[:i], p.faults[i+1:]...)
			p.armed.Add(-1)
			return
		}
	}
}

func (p *FaultProxy) arm(kind faultKind, rule Rule) *Fault {
	f := &Fault{
		p:     p,
		kind:  kind,
		rule:  rule,
		done:  make(chan struct{}),
		skip:  max(rule.Nth, 1) - 1,
		times: max(rule.Times, 1),
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// armed before after: a round trip that saw no fault armed (and so kept
	// no SQL) was sent before after was read, and can never match.
	p.armed.Add(1)
	f.after = p.commands.Load()
	p.faults = append(p.faults, f)
	return f
}

// matches reports whether f acts on rt at a reply message of type typ (tag
// is a CommandComplete's tag). It counts each round trip once towards Nth.
// The caller holds p.mu.
func (f *Fault) matches(rt *roundTrip, typ byte, tag string, sqls []string) bool {
	if rt.seq <= f.after {
		return false
	}
	if _, counted := rt.counted[f]; counted {
		return false
	}
	if f.rule.Tag != "" && (typ != 'C' || !hasPrefixFold(tag, f.rule.Tag)) {
		return false
	}
	if f.rule.SQL != "" && !containsAny(sqls, f.rule.SQL) {
		return false
	}
	if rt.counted == nil {
		rt.counted = make(map[*Fault]struct{})
	}
	rt.counted[f] = struct{}{}
	if f.skip > 0 {
		f.skip--
		return false
	}
	return true
}

// evaluate runs the armed faults against a message of rt's reply and says
// what to do with it.
func (p *FaultProxy) evaluate(c *proxyConn, rt *roundTrip, typ byte, tag string) (stall, lose bool) {
	c.mu.Lock()
	sqls := rt.sqls
	c.mu.Unlock()

	p.mu.Lock()
	defer p.mu.Unlock()
	kept := p.faults[:0]
	for _, f := range p.faults {
		if f.matches(rt, typ, tag, sqls) {
			f.fired++
			switch f.kind {
			case faultStall:
				stall = true
			case faultLose:
				lose = true
			}
			if f.fired == f.times {
				close(f.done)
				p.armed.Add(-1)
				continue
			}
		}
		kept = append(kept, f)
	}
	clear(p.faults[len(kept):])
	p.faults = kept
	return stall, lose
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

func containsAny(texts []string, sub string) bool {
	for _, t := range texts {
		if strings.Contains(t, sub) {
			return true
		}
	}
	return false
}

// waitRunning returns at once unless the proxy is stalled, and otherwise
// when it resumes or ctx (a connection's) ends.
func (p *FaultProxy) waitRunning(ctx context.Context) error {
	p.mu.Lock()
	stalled := p.stalled
	p.mu.Unlock()
	if stalled == nil {
		return nil
	}
	select {
	case <-stalled:
		return nil
	case <-ctx.Done():
		return errConnDone
	}
}

func (p *FaultProxy) accept() {
	defer p.wg.Done()
	var backoff time.Duration
	for {
		conn, err := p.ln.Accept()
		if err != nil {
			if p.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors, say: wait a little, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-p.ctx.Done():
				t.Stop()
				return
			}
			continue
		}
		backoff = 0
		ctx, cancel := context.WithCancel(p.ctx)
		c := &proxyConn{p: p, client: conn, ctx: ctx, cancel: cancel, stmts: make(map[string]string)}
		if !p.track(c) {
			cancel()
			_ = conn.Close()
			return
		}
		go p.serve(c)
	}
}

// track registers a new connection and counts its goroutine in p.wg,
// unless the proxy is closed.
func (p *FaultProxy) track(c *proxyConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	p.wg.Add(1)
	return true
}

func (p *FaultProxy) untrack(c *proxyConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

// spawn runs f in a goroutine that Close waits for. Only the proxy's own
// goroutines call it, so p.wg is never zero then.
func (p *FaultProxy) spawn(f func()) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		f()
	}()
}

// proxyConn is one client connection and its connection to the target.
type proxyConn struct {
	p      *FaultProxy
	client net.Conn
	ctx    context.Context // ends with the connection
	cancel context.CancelFunc

	mu     sync.Mutex
	server net.Conn
	closed bool
	queue  []*roundTrip // sent, reply not complete yet, oldest first

	// Owned by the goroutine reading from the client.
	group      *roundTrip // the round trip being sent, until its Sync
	stmts      map[string]string
	stmtsBytes int
}

// roundTrip is one command as the proxy tracks it.
type roundTrip struct {
	seq int64 // Commands() once it was sent

	// Guarded by proxyConn.mu.
	synced bool     // its Query, FunctionCall or Sync has been sent: a ReadyForQuery will end it
	sqls   []string // the statements it executes

	// Owned by the goroutine reading from the server.
	replying bool

	// Guarded by FaultProxy.mu.
	counted map[*Fault]struct{}
}

// ending is how a connection is shut down.
type ending int

const (
	endClose ending = iota // FIN both ways: Close, or one side hung up
	endLost                // RST to the client, FIN to the server: a lost reply
	endReset               // RST both ways: ResetAll
)

// shutdown closes the connection once; it reports whether this call did.
func (c *proxyConn) shutdown(how ending) bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	c.closed = true
	server := c.server
	c.mu.Unlock()

	c.cancel()
	if how != endClose {
		setLinger0(c.client)
	}
	_ = c.client.Close()
	if server != nil {
		if how == endReset {
			setLinger0(server)
		}
		_ = server.Close()
	}
	return true
}

// gated writes to a connection unless the proxy is stalled, in which case
// it waits: every byte the proxy forwards goes through one.
type gated struct {
	c    *proxyConn
	conn net.Conn
}

func (g gated) Write(b []byte) (int, error) {
	if err := g.c.p.waitRunning(g.c.ctx); err != nil {
		return 0, err
	}
	return g.conn.Write(b)
}

// serve handles the startup phase of a client connection, then relays it.
func (p *FaultProxy) serve(c *proxyConn) {
	defer p.wg.Done()
	defer p.untrack(c)
	defer c.shutdown(endClose)

	if p.waitRunning(c.ctx) != nil {
		return
	}
	cr := bufio.NewReaderSize(c.client, bufferSize)
	cw := bufio.NewWriterSize(gated{c, c.client}, bufferSize)
	for {
		packet, code, ok, err := readStartup(cr)
		if err != nil {
			return
		}
		if ok && (code == sslRequest || code == gssencRequest) {
			// Answer for the server: no encryption. The client goes on in
			// plaintext (or gives up, if it requires TLS).
			if cw.WriteByte('N') != nil || cw.Flush() != nil {
				return
			}
			continue
		}

		server, err := c.dial()
		if err != nil {
			return
		}
		sr := bufio.NewReaderSize(server, bufferSize)
		sw := bufio.NewWriterSize(gated{c, server}, bufferSize)
		if _, err := sw.Write(packet); err != nil {
			return
		}
		if !ok || code == cancelRequest {
			// Not ours to parse: relay bytes as they are.
			if sw.Flush() != nil {
				return
			}
			p.spawn(func() {
				_ = relay(sw, cr)
				c.shutdown(endClose)
			})
			_ = relay(cw, sr)
			return
		}
		// A StartupMessage: from here on both directions are typed
		// messages, authentication included.
		p.spawn(func() {
			_ = c.frontend(newWire(cr, sw))
			c.shutdown(endClose)
		})
		_ = c.backend(newWire(sr, cw))
		return
	}
}

func (c *proxyConn) dial() (net.Conn, error) {
	ctx, cancel := context.WithTimeout(c.ctx, dialTimeout)
	defer cancel()
	var d net.Dialer
	server, err := d.DialContext(ctx, "tcp", c.p.target)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		_ = server.Close()
		return nil, errConnDone
	}
	c.server = server
	return server, nil
}

// frontend forwards the client's messages to the server, registering each
// round trip before its first message leaves, so that its reply always
// finds it.
func (c *proxyConn) frontend(s *wire) error {
	for {
		typ, size, head, err := s.next(frontendHead)
		if err != nil {
			return err
		}
		c.observe(typ, head)
		if err := s.forward(size, head); err != nil {
			return err
		}
	}
}

func (c *proxyConn) observe(typ byte, head []byte) {
	switch typ {
	case 'Q': // Query
		rt := c.sending()
		if c.p.armed.Load() > 0 {
			sql, _ := cstring(head)
			c.addSQL(rt, sql)
		}
		c.sync(rt)
	case 'F': // FunctionCall
		c.sync(c.sending())
	case 'S': // Sync
		c.sync(c.sending())
	case 'P': // Parse: remember the statement; it runs when bound
		name, rest := cstring(head)
		sql, _ := cstring(rest)
		c.remember(name, sql)
		c.sending()
	case 'B': // Bind: the statement it binds will run
		_, rest := cstring(head)
		name, _ := cstring(rest)
		rt := c.sending()
		if sql, ok := c.stmts[name]; ok && c.p.armed.Load() > 0 {
			c.addSQL(rt, sql)
		}
	case 'C': // Close
		if len(head) > 0 && head[0] == 'S' {
			name, _ := cstring(head[1:])
			c.forget(name)
		}
		c.sending()
	case 'D', 'E': // Describe, Execute
		c.sending()
	}
	// Flush, Terminate, copy data and authentication responses belong to
	// no new round trip.
	//
	// The SQL a round trip executes is kept only while a fault is armed: a
	// fault armed later never matches a round trip already registered.
	// Prepared statements are always remembered, since a later round trip
	// may execute them.
}

// sending returns the round trip being sent, registering a new one if none
// is.
func (c *proxyConn) sending() *roundTrip {
	if c.group != nil {
		return c.group
	}
	rt := &roundTrip{seq: c.p.commands.Add(1)}
	c.mu.Lock()
	c.queue = append(c.queue, rt)
	c.mu.Unlock()
	c.group = rt
	return rt
}

func (c *proxyConn) sync(rt *roundTrip) {
	c.mu.Lock()
	rt.synced = true
	c.mu.Unlock()
	c.group = nil
}

func (c *proxyConn) addSQL(rt *roundTrip, sql string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range rt.sqls {
		if s == sql {
			return
		}
	}
	rt.sqls = append(rt.sqls, sql)
}

// remember keeps a prepared statement's SQL, within a budget per
// connection, so a later Bind of it can be matched by Rule.SQL.
func (c *proxyConn) remember(name, sql string) {
	c.forget(name)
	if c.stmtsBytes+len(sql) > stmtsBudget {
		return
	}
	c.stmts[name] = sql
	c.stmtsBytes += len(sql)
}

func (c *proxyConn) forget(name string) {
	if old, ok := c.stmts[name]; ok {
		c.stmtsBytes -= len(old)
		delete(c.stmts, name)
	}
}

// backend forwards the server's messages to the client, applying latency
// and the armed faults to the replies of round trips.
func (c *proxyConn) backend(s *wire) error {
	for {
		typ, size, head, err := s.next(backendHead)
		if err != nil {
			return err
		}
		c.mu.Lock()
		var rt *roundTrip
		if len(c.queue) > 0 {
			rt = c.queue[0]
			if typ == 'Z' && rt.synced {
				c.queue[0] = nil
				c.queue = c.queue[1:]
			}
		}
		c.mu.Unlock()

		if rt != nil {
			if !rt.replying {
				rt.replying = true
				if err := c.delay(); err != nil {
					return err
				}
			}
			if isOutcome(typ) && c.p.armed.Load() > 0 {
				var tag string
				if typ == 'C' {
					tag, _ = cstring(head)
				}
				stall, lose := c.p.evaluate(c, rt, typ, tag)
				if stall {
					c.p.Stall()
				}
				if lose {
					return c.loseReply(s, rt, typ, size, head)
				}
			}
		}
		if err := s.forward(size, head); err != nil {
			return err
		}
	}
}

// delay waits out the latency set by SetLatency.
func (c *proxyConn) delay() error {
	d := time.Duration(c.p.latency.Load())
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-c.ctx.Done():
		return errConnDone
	}
}

// loseReply discards the rest of rt's reply, from the message next just
// returned, and resets the client. It first reads up to ReadyForQuery, so
// that the server has finished the round trip (every statement in it ran)
// before the client learns anything; a round trip whose Sync has not been
// sent gets no ReadyForQuery, and is cut at once.
func (c *proxyConn) loseReply(s *wire, rt *roundTrip, typ byte, size int, head []byte) error {
	defer c.shutdown(endLost)
	if err := s.skip(size, head); err != nil {
		return err
	}
	c.mu.Lock()
	synced := rt.synced
	c.mu.Unlock()
	for synced && typ != 'Z' {
		var err error
		typ, size, head, err = s.next(backendHead)
		if err != nil {
			return err
		}
		if err := s.skip(size, head); err != nil {
			return err
		}
	}
	return errConnDone
}

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
