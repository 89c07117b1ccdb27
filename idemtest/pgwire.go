package idemtest

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
)

// The Postgres wire protocol, as much of it as the fault proxy needs: the
// untyped startup packets, and typed messages (a type byte, then an int32
// length that counts itself but not the type byte) in both directions. The
// proxy forwards every byte it reads unchanged; it only looks at message
// types, and at the start of a few bodies (SQL texts, statement names,
// command tags), so messages of any size stream through in bounded memory.

// Startup request codes (the int32 after a startup packet's length).
const (
	cancelRequest = 80877102
	sslRequest    = 80877103
	gssencRequest = 80877104

	// maxStartupPacket is the server's own limit (MAX_STARTUP_PACKET_LENGTH).
	maxStartupPacket = 10000
	// maxMessage is the largest length the int32 length field can carry.
	maxMessage = 1<<31 - 1
)

// How much of a body the proxy reads before forwarding it: the SQL of a
// Query or Parse (longer SQL is matched by its first sqlCapture bytes), the
// names at the start of a Bind or Close, a command tag. Everything past that
// is streamed in chunks.
const (
	sqlCapture  = 1 << 20
	namesLimit  = 256
	chunkSize   = 32 << 10
	bufferSize  = 32 << 10
	stmtsBudget = 16 << 20 // SQL of prepared statements remembered per connection
)

func frontendHead(typ byte) int {
	switch typ {
	case 'Q', 'P':
		return sqlCapture
	case 'B', 'C':
		return namesLimit
	}
	return 0
}

func backendHead(typ byte) int {
	if typ == 'C' {
		return namesLimit
	}
	return 0
}

// isOutcome reports whether a backend message tells the client how (part
// of) its round trip ended: CommandComplete, EmptyQueryResponse,
// ErrorResponse, PortalSuspended, FunctionCallResponse, ReadyForQuery.
// Rules act at these messages, never earlier, so a command whose reply is
// lost or held has been executed by the server.
func isOutcome(typ byte) bool {
	switch typ {
	case 'C', 'I', 'E', 's', 'V', 'Z':
		return true
	}
	return false
}

// cstring splits a NUL-terminated string off the front of b. Without a NUL
// (a body cut at its head limit) all of b is the string.
func cstring(b []byte) (string, []byte) {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return string(b[:i]), b[i+1:]
	}
	return string(b), nil
}

// wire is one direction of a proxied connection: messages read from r are
// written to w. Writes are buffered, and flushed before any read that would
// wait for the network, so the proxy batches what arrived together and
// never sits on bytes while it waits.
type wire struct {
	r     *bufio.Reader
	w     *bufio.Writer
	hdr   [5]byte
	head  []byte // scratch for inspected bodies
	chunk []byte // scratch for streamed bodies
}

func newWire(r *bufio.Reader, w *bufio.Writer) *wire {
	return &wire{r: r, w: w, chunk: make([]byte, chunkSize)}
}

// fill reads exactly len(b) bytes, flushing pending writes first if the
// read may have to wait for them.
func (s *wire) fill(b []byte) error {
	if s.r.Buffered() < len(b) {
		if err := s.w.Flush(); err != nil {
			return err
		}
	}
	_, err := io.ReadFull(s.r, b)
	return err
}

// next reads a typed message's header and the first limit(type) bytes of
// its body. It returns the type, the body's full size and that head; the
// rest of the body is still to be read, by forward or skip.
func (s *wire) next(limit func(byte) int) (typ byte, size int, head []byte, err error) {
	if err := s.fill(s.hdr[:]); err != nil {
		return 0, 0, nil, err
	}
	typ = s.hdr[0]
	n := binary.BigEndian.Uint32(s.hdr[1:])
	if n < 4 || n > maxMessage {
		return 0, 0, nil, fmt.Errorf("idemtest: fault proxy: message %q with invalid length %d", typ, n)
	}
	size = int(n) - 4
	h := min(size, limit(typ))
	if cap(s.head) < h {
		s.head = make([]byte, h)
	}
	head = s.head[:h]
	if err := s.fill(head); err != nil {
		return 0, 0, nil, err
	}
	return typ, size, head, nil
}

// forward writes the message next returned, streaming the rest of its body.
func (s *wire) forward(size int, head []byte) error {
	if _, err := s.w.Write(s.hdr[:]); err != nil {
		return err
	}
	if _, err := s.w.Write(head); err != nil {
		return err
	}
	return s.stream(size-len(head), true)
}

// skip reads and discards the rest of the message next returned.
func (s *wire) skip(size int, head []byte) error {
	return s.stream(size-len(head), false)
}

func (s *wire) stream(n int, write bool) error {
	for n > 0 {
		k := min(n, len(s.chunk))
		if err := s.fill(s.chunk[:k]); err != nil {
			return err
		}
		if write {
			if _, err := s.w.Write(s.chunk[:k]); err != nil {
				return err
			}
		}
		n -= k
	}
	return nil
}

// relay copies bytes from r to w until either fails, for connections the
// proxy does not parse (cancel requests, unknown startup codes).
func relay(w *bufio.Writer, r *bufio.Reader) error {
	buf := make([]byte, chunkSize)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			if r.Buffered() == 0 {
				if werr := w.Flush(); werr != nil {
					return werr
				}
			}
		}
		if err != nil {
			return err
		}
	}
}

// readStartup reads one untyped startup packet: an int32 length that counts
// itself, an int32 code, the rest. ok is false when the first eight bytes do
// not look like a startup packet; packet then holds just those bytes.
func readStartup(r *bufio.Reader) (packet []byte, code uint32, ok bool, err error) {
	var first [8]byte
	if _, err := io.ReadFull(r, first[:]); err != nil {
		return nil, 0, false, err
	}
	n := binary.BigEndian.Uint32(first[:4])
	code = binary.BigEndian.Uint32(first[4:])
	known := code == cancelRequest || code == sslRequest || code == gssencRequest || code>>16 == 3 // StartupMessage: protocol 3.x
	if !known || n < 8 || n > maxStartupPacket {
		return first[:], code, false, nil
	}
	packet = make([]byte, n)
	copy(packet, first[:])
	if _, err := io.ReadFull(r, packet[8:]); err != nil {
		return nil, 0, false, err
	}
	return packet, code, true, nil
}

// errConnDone ends a connection's goroutines once the proxy has decided
// its fate (a reset, a lost reply, Close); it is never reported.
var errConnDone = errors.New("idemtest: fault proxy: connection closed")

// setLinger0 makes Close send a TCP RST instead of a FIN.
func setLinger0(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
}
