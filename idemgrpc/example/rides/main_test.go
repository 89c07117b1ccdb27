package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/go-idem/idem/idemgrpc/example/rides/ridespb"
	"github.com/go-idem/idem/internal/pgtest"
)

// childEnv makes the test binary run the rides program instead of the
// tests: the kill test starts its servers this way, as real processes.
const childEnv = "RIDES_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := run(ctx, os.Args[1:], os.Stdout)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "rides:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	pgtest.Main(m)
}

// A server is killed with SIGKILL after the provider charged and before the
// charge phase committed. The client's retry, against a restarted server,
// gets the ride, and the ledger holds exactly one charge for it.
func TestKilledServerChargesOnce(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewSchema(t)
	pay := newPayments(0)
	paySrv := httptest.NewServer(pay)
	t.Cleanup(paySrv.Close)
	args := func(addr string) []string {
		// A short lease: the killed server's key is taken over 2 s after
		// it died, instead of 90.
		return []string{"serve", "--addr", addr, "--database-url", schema.URL, "--payments-url", paySrv.URL, "--lease", "2s"}
	}

	first := startChild(t, []string{crashAfterChargeEnv + "=hang"}, args("127.0.0.1:0")...)
	addr := strings.TrimPrefix(first.waitFor(t, "listening on "), "listening on ")
	conn, err := dial(addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	client := ridespb.NewRidesClient(conn)

	req := &ridespb.CreateRideRequest{
		RequestId: uuid.NewString(),
		Origin:    &ridespb.Point{Lat: 37.7749, Lon: -122.4194},
		Target:    &ridespb.Point{Lat: 37.8044, Lon: -122.2712},
	}
	md := metadata.Pairs("authorization", "Bearer user@example.com")
	var mu sync.Mutex
	var seen []attempt
	booked := make(chan attempt, 1)
	go func() {
		booked <- bookRide(t.Context(), client, md, req,
			retryPolicy{attempts: 200, attemptTimeout: time.Minute, backoff: 50 * time.Millisecond, maxBackoff: 500 * time.Millisecond},
			func(a attempt) {
				mu.Lock()
				defer mu.Unlock()
				seen = append(seen, a)
				t.Log(a)
			})
	}()

	crash := first.waitFor(t, "crash point: ")
	t.Log(crash)
	first.kill(t)
	restartOn(t, addr, args(addr)...)

	final := <-booked
	require.Nil(t, final.status, "the retry must book the ride: %v", final)
	ride := final.ride
	mu.Lock()
	require.Equal(t, codes.Unavailable, seen[0].status.Code(), "the first attempt died with its server")
	mu.Unlock()

	// Charged exactly once: the provider was asked again (the interrupted
	// phase ran again with the same downstream key) and answered with the
	// first charge.
	ledger := pay.charges()
	require.Len(t, ledger, 1, "ledger: %+v", ledger)
	require.Equal(t, ride.GetChargeId(), ledger[0].ID)
	require.Equal(t, fmt.Sprintf("Charge for ride %d", ride.GetRideId()), ledger[0].Description)
	require.Equal(t, 2, pay.requests(), "the charge was asked for twice, and made once")
	require.Contains(t, crash, fmt.Sprintf("ride %d charged as %s", ride.GetRideId(), ride.GetChargeId()))

	var rides, receipts int
	var chargeID string
	require.NoError(t, schema.Pool.QueryRow(t.Context(), `SELECT count(*), max(charge_id) FROM rides`).Scan(&rides, &chargeID))
	require.NoError(t, schema.Pool.QueryRow(t.Context(), `SELECT count(*) FROM receipts`).Scan(&receipts))
	require.Equal(t, 1, rides)
	require.Equal(t, 1, receipts)
	require.Equal(t, ride.GetChargeId(), chargeID)

	// Every later retry replays the same ride.
	again := callOnce(t.Context(), client, md, req, time.Minute)
	require.Nil(t, again.status)
	require.True(t, again.replayed)
	require.True(t, proto.Equal(ride, again.ride))
	require.Len(t, pay.charges(), 1)
}

// The client's view of the contract, as the README shows it: a booking, its
// replay, a declined card stored and replayed, a reused key, a missing key,
// an invalid request.
func TestBookCommand(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewSchema(t)
	paySrv := httptest.NewServer(newPayments(0))
	t.Cleanup(paySrv.Close)
	ctx, cancel := context.WithCancel(t.Context())
	lines := make(chan string, 16)
	served := make(chan error, 1)
	go func() {
		served <- serveCommand(ctx, []string{"--addr", "127.0.0.1:0", "--database-url", schema.URL, "--payments-url", paySrv.URL}, lineWriter(lines))
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-served)
	})
	var addr string
	select {
	case l := <-lines:
		addr = strings.TrimPrefix(l, "listening on ")
	case err := <-served:
		t.Fatalf("serve: %v", err)
	}

	book := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := bookCommand(t.Context(), append([]string{"--addr", addr}, args...), &out)
		t.Log(out.String())
		return out.String(), err
	}
	id := uuid.NewString()

	out, err := book("--request-id", id)
	require.NoError(t, err)
	require.Regexp(t, `attempt 1: OK ride_id=1 charge_id=ch_1 amount=2000 usd "Payment accepted. Your pilot is on their way!"`, out)

	out, err = book("--request-id", id, "--key-in", "metadata")
	require.NoError(t, err)
	require.Contains(t, out, `attempt 1: OK (idempotent-replayed: true) ride_id=1 charge_id=ch_1`)

	out, err = book("--request-id", id, "--target", "40.7128,-74.0060")
	require.Error(t, err)
	require.Contains(t, out, "attempt 1: FailedPrecondition reason=IDEMPOTENCY_KEY_REUSED precondition=IDEMPOTENCY_KEY/request_id:")

	declined := uuid.NewString()
	for i, want := range []string{
		"attempt 1: FailedPrecondition reason=CARD_DECLINED: Your card was declined.",
		"attempt 1: FailedPrecondition (idempotent-replayed: true) reason=CARD_DECLINED: Your card was declined.",
	} {
		out, err = book("--request-id", declined, "--user", "user-bad-source@example.com")
		require.Error(t, err, "try %d", i)
		require.Contains(t, out, want)
	}

	out, err = book("--key-in", "none")
	require.Error(t, err)
	require.Contains(t, out, `attempt 1: InvalidArgument reason=IDEMPOTENCY_KEY_MISSING field=request_id(is required): This method needs an idempotency key`)

	out, err = book("--request-id", "not-a-uuid")
	require.Error(t, err)
	require.Contains(t, out, "attempt 1: InvalidArgument reason=IDEMPOTENCY_KEY_MALFORMED field=request_id(must be a UUID): ")

	out, err = book("--origin", "91,0")
	require.Error(t, err)
	require.Contains(t, out, "attempt 1: InvalidArgument field=origin.lat(must be between -90 and 90): The ride request is invalid.")

	out, err = book("--user", "nobody@example.com")
	require.Error(t, err)
	require.Contains(t, out, "attempt 1: Unauthenticated: unknown rider")
}

// child is a rides process started from the test binary.
type child struct {
	cmd    *exec.Cmd
	lines  chan string
	exited chan struct{}
	stderr *syncBuffer
}

func startChild(t *testing.T, env []string, args ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), childEnv+"=1"), env...)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	c := &child{cmd: cmd, lines: make(chan string, 64), exited: make(chan struct{}), stderr: &syncBuffer{}}
	cmd.Stderr = c.stderr
	dieWithParent(cmd)
	require.NoError(t, cmd.Start())
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		_ = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.exited
		if t.Failed() {
			t.Logf("%s's stderr:\n%s", strings.Join(args, " "), c.stderr.String())
		}
	})
	return c
}

// restartOn starts a server on the address a killed one listened on. The
// port is free again once the kill is through, but between the two another
// test's outgoing connection may take it for a moment: a start that fails to
// bind is tried again, for a bounded while.
func restartOn(t *testing.T, addr string, args ...string) *child {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; {
		c := startChild(t, nil, args...)
		if c.listening() {
			return c
		}
		if !strings.Contains(c.stderr.String(), "address already in use") || time.Now().After(deadline) {
			t.Fatalf("the restarted server exited before listening on %s; stderr:\n%s", addr, c.stderr.String())
		}
		t.Logf("%s is taken for now; starting the server again", addr)
	}
}

// listening reports whether the child prints that it listens before it
// exits.
func (c *child) listening() bool {
	for {
		select {
		case l := <-c.lines:
			if strings.HasPrefix(l, "listening on ") {
				return true
			}
		case <-c.exited:
			return false
		}
	}
}

// waitFor returns the child's next stdout line that starts with prefix.
func (c *child) waitFor(t *testing.T, prefix string) string {
	t.Helper()
	for {
		select {
		case l := <-c.lines:
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-c.exited:
			t.Fatalf("the server exited before printing %q; stderr:\n%s", prefix, c.stderr.String())
		}
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (c *child) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Kill())
	<-c.exited
	ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ok {
		require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "exit: %v", c.cmd.ProcessState)
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// lineWriter sends each line written to it to a channel.
type lineWriter chan string

func (w lineWriter) Write(p []byte) (int, error) {
	for l := range strings.SplitSeq(strings.TrimRight(string(p), "\n"), "\n") {
		w <- l
	}
	return len(p), nil
}

var _ io.Writer = lineWriter(nil)
