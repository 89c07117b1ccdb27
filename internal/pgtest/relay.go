package pgtest

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// relayDialTimeout bounds the relay's connection to its target.
const relayDialTimeout = 5 * time.Second

// relay forwards TCP connections from a port of its own on 127.0.0.1 to a target, and can hold
// everything passing through it, both ways: the pair's standby reaches the primary through one.
//
// While held, each direction of each connection reads at most one chunk from its source, which it
// keeps until release; the kernel's buffers fill behind it and the sender blocks, as it would on a
// congested network. Nothing is lost, so replication resumes where it stopped.
type relay struct {
	listener net.Listener
	target   string

	mu        sync.Mutex
	cond      *sync.Cond // signalled when held, closed or inflight change
	held      bool
	closed    bool
	inflight  int   // writes under way, which hold waits for
	forwarded int64 // bytes written to either side, for tests
	conns     map[net.Conn]struct{}
	wg        sync.WaitGroup

	// waiting receives a value, if there is room, whenever a chunk starts waiting for release, so
	// a test can tell without sleeping that the relay holds something.
	waiting chan struct{}
}

func newRelay(target string) (*relay, error) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("pgtest: relay: %w", err)
	}
	r := &relay{
		listener: listener,
		target:   target,
		conns:    make(map[net.Conn]struct{}),
		waiting:  make(chan struct{}, 1),
	}
	r.cond = sync.NewCond(&r.mu)
	r.wg.Add(1)
	go r.serve()
	return r, nil
}

func (r *relay) addr() string { return r.listener.Addr().String() }

func (r *relay) port() int { return r.listener.Addr().(*net.TCPAddr).Port }

func (r *relay) serve() {
	defer r.wg.Done()
	for {
		client, err := r.listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // a failed accept says nothing about the next one
		}
		r.wg.Add(1)
		go r.connect(client)
	}
}

// connect dials the target for a client and copies between them until either side closes.
func (r *relay) connect(client net.Conn) {
	defer r.wg.Done()
	if !r.track(client) {
		return
	}
	defer r.untrack(client)
	server, err := net.DialTimeout("tcp", r.target, relayDialTimeout)
	if err != nil {
		return // the target is down: the client sees its connection closed, as if refused
	}
	if !r.track(server) {
		return
	}
	defer r.untrack(server)

	done := make(chan struct{}, 2)
	go func() { r.pipe(server, client); done <- struct{}{} }()
	go func() { r.pipe(client, server); done <- struct{}{} }()
	<-done
	// One side is finished: end the other too, unblocking its reads and writes.
	_ = client.Close()
	_ = server.Close()
	<-done
}

// track registers a connection, so close can end it; on a closed relay it closes it instead.
func (r *relay) track(conn net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		_ = conn.Close()
		return false
	}
	r.conns[conn] = struct{}{}
	return true
}

func (r *relay) untrack(conn net.Conn) {
	_ = conn.Close()
	r.mu.Lock()
	delete(r.conns, conn)
	r.mu.Unlock()
}

// pipe copies from src to dst, each chunk only while the relay is not held.
func (r *relay) pipe(dst, src net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, readErr := src.Read(buf)
		if n > 0 {
			if !r.acquire() {
				return
			}
			_, writeErr := dst.Write(buf[:n])
			r.releaseWrite(n)
			if writeErr != nil {
				return
			}
		}
		if readErr != nil {
			return
		}
	}
}

// acquire waits until the relay is not held, and counts a write as under way. It returns false
// when the relay is closed.
func (r *relay) acquire() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held && !r.closed {
		select {
		case r.waiting <- struct{}{}:
		default:
		}
	}
	for r.held && !r.closed {
		r.cond.Wait()
	}
	if r.closed {
		return false
	}
	r.inflight++
	return true
}

func (r *relay) releaseWrite(n int) {
	r.mu.Lock()
	r.inflight--
	r.forwarded += int64(n)
	r.cond.Broadcast()
	r.mu.Unlock()
}

// hold stops the relay forwarding anything. When it returns, no write is under way, and none will
// start before release.
func (r *relay) hold() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.held = true
	for r.inflight > 0 {
		r.cond.Wait()
	}
}

// release lets what the relay held, and everything after it, through.
func (r *relay) release() {
	r.mu.Lock()
	r.held = false
	r.cond.Broadcast()
	r.mu.Unlock()
}

// forwardedBytes is how many bytes the relay has written to either side.
func (r *relay) forwardedBytes() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.forwarded
}

// close stops listening, drops every connection, and waits for its goroutines to finish.
func (r *relay) close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.cond.Broadcast()
	for conn := range r.conns {
		_ = conn.Close()
	}
	r.mu.Unlock()
	err := r.listener.Close()
	r.wg.Wait()
	if err != nil {
		return fmt.Errorf("pgtest: relay: %w", err)
	}
	return nil
}
