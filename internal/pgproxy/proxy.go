// Package pgproxy is a TCP proxy in front of Postgres that reads the protocol with pgx's pgproto3
// and injects real network faults: a reply lost after the server executed the command, a stall, a
// reset, latency. idemtest's FaultProxy is its public face; internal/pgtest holds a pair's
// replication connection with it.
//
// A round trip is a simple Query, or a group of extended-protocol messages ending with Sync (a pgx
// batch, with all its statements, is one), or a FunctionCall; its reply ends with the server's
// ReadyForQuery. Every message is decoded and re-encoded unchanged in content (the startup
// parameters may change order). Authentication, whatever the method (GSSAPI aside), and cancel
// requests are relayed. The proxy refuses SSL and GSS encryption on the server's behalf, to keep
// the stream readable: clients connect with sslmode=disable or prefer.
package pgproxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

const (
	// dialTimeout bounds connecting to the target, so a client of a proxy whose target is gone
	// gets an error rather than a hang.
	dialTimeout = 30 * time.Second
	// bufferSize is each direction's write buffer: what arrived together leaves together.
	bufferSize = 32 << 10
	// sqlCapture is how much of a statement's text Rule.SQL searches.
	sqlCapture = 1 << 20
	// stmtsBudget bounds the SQL of prepared statements remembered per connection.
	stmtsBudget = 16 << 20
)

// errConnDone ends a connection's goroutines once the proxy has decided its fate (a reset, a
// lost reply, Close); it is never reported.
var errConnDone = errors.New("pgproxy: connection closed")

// Proxy forwards connections from a port of its own on 127.0.0.1 to a Postgres server. It is safe
// for concurrent use. Close it when done: it ends every connection and goroutine it started.
type Proxy struct {
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
	conns   map[*conn]struct{}
	faults  []*Fault      // armed, in arming order
	stalled chan struct{} // non-nil while stalled; closed by Resume
	writing int           // writes under way, which Hold waits for
	idle    chan struct{} // non-nil while Hold waits; closed when writing falls to 0

	// waiting receives a value, if there is room, whenever a write starts waiting for Resume, so
	// a test can tell without sleeping that the proxy holds something.
	waiting chan struct{}
}

// Start starts a proxy listening on 127.0.0.1 on a free port and forwarding to target, a
// host:port. It only listens; connections to the target are made when clients connect. ctx
// bounds the start only; the proxy runs until Close.
func Start(ctx context.Context, target string) (*Proxy, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("pgproxy: listen: %w", err)
	}
	pctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		target:  target,
		ln:      ln,
		ctx:     pctx,
		cancel:  cancel,
		conns:   make(map[*conn]struct{}),
		waiting: make(chan struct{}, 1),
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients connect to, "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the port clients connect to.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// Commands returns how many round trips clients have sent through the proxy since it started.
func (p *Proxy) Commands() int64 { return p.commands.Load() }

// SetLatency delays the reply to every round trip by d from now on; zero turns it off. Startup
// and authentication are not delayed.
func (p *Proxy) SetLatency(d time.Duration) {
	p.latency.Store(int64(max(d, 0)))
}

// Stall holds all traffic, both ways, on every connection: nothing is dropped, and nothing more
// is delivered until Resume. New connections are accepted and held too. It returns at once: a
// write already under way may still complete (see Hold).
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
}

// Hold stalls as Stall does, and returns once no write is under way: from then on not a byte
// reaches either side until Resume. A write the receiver does not read keeps it waiting.
func (p *Proxy) Hold() {
	p.mu.Lock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
	if p.writing == 0 {
		p.mu.Unlock()
		return
	}
	if p.idle == nil {
		p.idle = make(chan struct{})
	}
	idle := p.idle
	p.mu.Unlock()
	<-idle
}

// Resume ends a stall (from Stall, Hold or a StallReply fault): everything held is delivered, in
// order, on the connections that are still open.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
}

// ResetAll resets every open connection, client and server side, with a TCP RST, and returns how
// many it reset. New connections are unaffected.
func (p *Proxy) ResetAll() int {
	n := 0
	for _, c := range p.openConns() {
		if c.shutdown(endReset) {
			n++
		}
	}
	return n
}

// Close stops listening and closes every connection, and returns once every goroutine of the
// proxy has ended. Calling it again is a no-op.
func (p *Proxy) Close() error {
	p.mu.Lock()
	first := !p.closed
	p.closed = true
	p.mu.Unlock()
	var err error
	if first {
		p.cancel()
		if err = p.ln.Close(); errors.Is(err, net.ErrClosed) {
			err = nil
		}
		for _, c := range p.openConns() {
			c.shutdown(endClose)
		}
	}
	p.wg.Wait()
	if err != nil {
		return fmt.Errorf("pgproxy: close: %w", err)
	}
	return nil
}

func (p *Proxy) openConns() []*conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	conns := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	return conns
}

// startWrite returns once the proxy is not stalled, counting a write as under way, or errConnDone
// when ctx (a connection's) ends first.
func (p *Proxy) startWrite(ctx context.Context) error {
	for {
		p.mu.Lock()
		stalled := p.stalled
		if stalled == nil {
			p.writing++
			p.mu.Unlock()
			return nil
		}
		p.mu.Unlock()
		select {
		case p.waiting <- struct{}{}:
		default:
		}
		select {
		case <-stalled:
		case <-ctx.Done():
			return errConnDone
		}
	}
}

func (p *Proxy) endWrite() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.writing--
	if p.writing == 0 && p.idle != nil {
		close(p.idle)
		p.idle = nil
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	var backoff time.Duration
	for {
		client, err := p.ln.Accept()
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
		c := &conn{p: p, client: client, ctx: ctx, cancel: cancel, stmts: make(map[string]string)}
		if !p.track(c) {
			cancel()
			_ = client.Close()
			return
		}
		go p.serve(c)
	}
}

// track registers a new connection and counts its goroutine in p.wg, unless the proxy is closed.
func (p *Proxy) track(c *conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	p.wg.Add(1)
	return true
}

func (p *Proxy) untrack(c *conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

// spawn runs f in a goroutine that Close waits for. Only the proxy's own goroutines call it, so
// p.wg is never zero then.
func (p *Proxy) spawn(f func()) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		f()
	}()
}

// conn is one client connection and its connection to the target.
type conn struct {
	p      *Proxy
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

	// Guarded by conn.mu.
	synced bool     // its Query, FunctionCall or Sync has been sent: a ReadyForQuery will end it
	sqls   []string // the statements it executes

	// Owned by the goroutine reading from the server.
	replying bool

	// Guarded by Proxy.mu.
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
func (c *conn) shutdown(how ending) bool {
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

// setLinger0 makes Close send a TCP RST instead of a FIN.
func setLinger0(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
}

// gated writes to a connection unless the proxy is stalled, in which case it waits: every byte
// the proxy forwards goes through one.
type gated struct {
	c    *conn
	conn net.Conn
}

func (g gated) Write(b []byte) (int, error) {
	if err := g.c.p.startWrite(g.c.ctx); err != nil {
		return 0, err
	}
	defer g.c.p.endWrite()
	return g.conn.Write(b)
}

// flushFirst is the reader pgproto3 reads one side from: it flushes what the proxy buffered for
// the other side before each read, which may wait for the network, so the proxy batches what
// arrived together and never sits on bytes while it waits.
type flushFirst struct {
	r io.Reader
	w *bufio.Writer // nil until there is another side
}

func (f *flushFirst) Read(b []byte) (int, error) {
	if f.w != nil && f.w.Buffered() > 0 {
		if err := f.w.Flush(); err != nil {
			return 0, err
		}
	}
	return f.r.Read(b)
}

// encoder writes pgproto3 messages to a buffered side.
type encoder struct {
	w   *bufio.Writer
	buf []byte
}

func (e *encoder) write(msg pgproto3.Message) error {
	var err error
	if e.buf, err = msg.Encode(e.buf[:0]); err != nil {
		return fmt.Errorf("pgproxy: encode %T: %w", msg, err)
	}
	_, err = e.w.Write(e.buf)
	return err
}

// send writes msg and flushes: for the startup phase, where each side waits for the other.
func (e *encoder) send(msg pgproto3.Message) error {
	if err := e.write(msg); err != nil {
		return err
	}
	return e.w.Flush()
}

// serve handles the startup phase of a client connection, then relays it.
func (p *Proxy) serve(c *conn) {
	defer p.wg.Done()
	defer p.untrack(c)
	defer c.shutdown(endClose)

	if p.startWrite(c.ctx) != nil { // a stall holds new connections too
		return
	}
	p.endWrite()
	cw := bufio.NewWriterSize(gated{c, c.client}, bufferSize)
	fromClient := &flushFirst{r: c.client}
	backend := pgproto3.NewBackend(fromClient, nil) // only read: writes go through encoders
	for {
		msg, err := backend.ReceiveStartupMessage()
		if err != nil {
			return
		}
		switch msg.(type) {
		case *pgproto3.SSLRequest, *pgproto3.GSSEncRequest:
			// Answer for the server: no encryption. The client goes on in plaintext (or gives
			// up, if it requires TLS).
			if cw.WriteByte('N') != nil || cw.Flush() != nil {
				return
			}
			continue
		}

		server, err := c.dial()
		if err != nil {
			return
		}
		sw := bufio.NewWriterSize(gated{c, server}, bufferSize)
		toServer := &encoder{w: sw}
		if toServer.send(msg) != nil {
			return
		}
		if _, ok := msg.(*pgproto3.CancelRequest); ok {
			// The server acts on it and hangs up, saying nothing.
			_, _ = io.Copy(cw, server)
			_ = cw.Flush()
			return
		}
		frontend := pgproto3.NewFrontend(&flushFirst{r: server, w: cw}, nil)
		toClient := &encoder{w: cw}
		if c.authenticate(backend, frontend, toClient, toServer) != nil {
			return
		}
		fromClient.w = sw
		p.spawn(func() {
			_ = c.fromClient(backend, toServer)
			c.shutdown(endClose)
		})
		_ = c.fromServer(frontend, toClient)
		return
	}
}

func (c *conn) dial() (net.Conn, error) {
	ctx, cancel := context.WithTimeout(c.ctx, dialTimeout)
	defer cancel()
	var d net.Dialer
	server, err := d.DialContext(ctx, "tcp", c.p.target)
	if err != nil {
		return nil, fmt.Errorf("pgproxy: dial: %w", err)
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

// authenticate relays the server's authentication requests and the client's answers, one at a
// time: the client's answers all have type 'p', which pgproto3 decodes by the request it
// answers. It returns at AuthenticationOk, or at an error, which the server follows by hanging up.
func (c *conn) authenticate(backend *pgproto3.Backend, frontend *pgproto3.Frontend, toClient, toServer *encoder) error {
	for {
		msg, err := frontend.Receive()
		if err != nil {
			return err
		}
		if err := toClient.send(msg); err != nil {
			return err
		}
		switch msg.(type) {
		case *pgproto3.AuthenticationOk, *pgproto3.ErrorResponse:
			return nil
		case *pgproto3.AuthenticationCleartextPassword, *pgproto3.AuthenticationMD5Password,
			*pgproto3.AuthenticationSASL, *pgproto3.AuthenticationSASLContinue,
			*pgproto3.AuthenticationGSS, *pgproto3.AuthenticationGSSContinue:
		default:
			continue // SASLFinal, a notice, NegotiateProtocolVersion: nothing to answer
		}
		if err := backend.SetAuthType(frontend.GetAuthType()); err != nil {
			return fmt.Errorf("pgproxy: %w", err)
		}
		answer, err := backend.Receive()
		if err != nil {
			return err
		}
		if err := toServer.send(answer); err != nil {
			return err
		}
	}
}

// fromClient forwards the client's messages to the server, registering each round trip before
// its first message leaves, so that its reply always finds it.
func (c *conn) fromClient(backend *pgproto3.Backend, toServer *encoder) error {
	for {
		msg, err := backend.Receive()
		if err != nil {
			return err
		}
		c.observe(msg)
		if err := toServer.write(msg); err != nil {
			return err
		}
	}
}

// observe counts the round trip msg belongs to, and keeps the SQL it executes while a fault is
// armed: a fault armed later never matches a round trip already registered. Prepared statements
// are always remembered, since a later round trip may execute them. Flush, Terminate, copy data
// and authentication answers belong to no new round trip.
func (c *conn) observe(msg pgproto3.FrontendMessage) {
	switch m := msg.(type) {
	case *pgproto3.Query:
		rt := c.sending()
		if c.p.armed.Load() > 0 {
			c.addSQL(rt, capture(m.String))
		}
		c.sync(rt)
	case *pgproto3.FunctionCall, *pgproto3.Sync:
		c.sync(c.sending())
	case *pgproto3.Parse: // the statement runs when bound
		c.remember(m.Name, capture(m.Query))
		c.sending()
	case *pgproto3.Bind:
		rt := c.sending()
		if sql, ok := c.stmts[m.PreparedStatement]; ok && c.p.armed.Load() > 0 {
			c.addSQL(rt, sql)
		}
	case *pgproto3.Close:
		if m.ObjectType == 'S' {
			c.forget(m.Name)
		}
		c.sending()
	case *pgproto3.Describe, *pgproto3.Execute:
		c.sending()
	}
}

func capture(sql string) string {
	if len(sql) > sqlCapture {
		return strings.Clone(sql[:sqlCapture])
	}
	return sql
}

// sending returns the round trip being sent, registering a new one if none is.
func (c *conn) sending() *roundTrip {
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

func (c *conn) sync(rt *roundTrip) {
	c.mu.Lock()
	rt.synced = true
	c.mu.Unlock()
	c.group = nil
}

func (c *conn) addSQL(rt *roundTrip, sql string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range rt.sqls {
		if s == sql {
			return
		}
	}
	rt.sqls = append(rt.sqls, sql)
}

// remember keeps a prepared statement's SQL, within a budget per connection, so a later Bind of
// it can be matched by Rule.SQL.
func (c *conn) remember(name, sql string) {
	c.forget(name)
	if c.stmtsBytes+len(sql) > stmtsBudget {
		return
	}
	c.stmts[name] = sql
	c.stmtsBytes += len(sql)
}

func (c *conn) forget(name string) {
	if old, ok := c.stmts[name]; ok {
		c.stmtsBytes -= len(old)
		delete(c.stmts, name)
	}
}

// fromServer forwards the server's messages to the client, applying latency and the armed faults
// to the replies of round trips.
func (c *conn) fromServer(frontend *pgproto3.Frontend, toClient *encoder) error {
	for {
		msg, err := frontend.Receive()
		if err != nil {
			return err
		}
		_, ready := msg.(*pgproto3.ReadyForQuery)
		c.mu.Lock()
		var rt *roundTrip
		if len(c.queue) > 0 {
			rt = c.queue[0]
			if ready && rt.synced {
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
			if outcome, tag := isOutcome(msg); outcome && c.p.armed.Load() > 0 {
				stall, lose := c.p.evaluate(c, rt, tag)
				if stall {
					c.p.Stall()
				}
				if lose {
					return c.loseReply(frontend, rt, ready)
				}
			}
		}
		if err := toClient.write(msg); err != nil {
			return err
		}
	}
}

// isOutcome reports whether a server message tells the client how (part of) its round trip
// ended, and a CommandComplete's tag. Faults act at these messages, never earlier, so a command
// whose reply is lost or held has been executed by the server.
func isOutcome(msg pgproto3.BackendMessage) (outcome bool, tag *string) {
	switch m := msg.(type) {
	case *pgproto3.CommandComplete:
		s := string(m.CommandTag)
		return true, &s
	case *pgproto3.EmptyQueryResponse, *pgproto3.ErrorResponse, *pgproto3.PortalSuspended,
		*pgproto3.FunctionCallResponse, *pgproto3.ReadyForQuery:
		return true, nil
	}
	return false, nil
}

// delay waits out the latency set by SetLatency.
func (c *conn) delay() error {
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

// loseReply discards the rest of rt's reply, from the message fromServer just received, and
// resets the client. It first reads up to ReadyForQuery, so that the server has finished the
// round trip (every statement in it ran) before the client learns anything; a round trip whose
// Sync has not been sent gets no ReadyForQuery, and is cut at once.
func (c *conn) loseReply(frontend *pgproto3.Frontend, rt *roundTrip, ready bool) error {
	defer c.shutdown(endLost)
	c.mu.Lock()
	synced := rt.synced
	c.mu.Unlock()
	for synced && !ready {
		msg, err := frontend.Receive()
		if err != nil {
			return err
		}
		_, ready = msg.(*pgproto3.ReadyForQuery)
	}
	return errConnDone
}
