package idemgrpc_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/go-idem/idem/idemgrpc"
	"github.com/go-idem/idem/idemgrpc/internal/testpb"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/internal/testfixture"
)

var chargesvc struct {
	once sync.Once
	bin  string
	err  error
}

// chargesvcBin builds testdata/chargesvc once per test binary.
func chargesvcBin(t *testing.T) string {
	t.Helper()
	chargesvc.once.Do(func() {
		dir, err := os.MkdirTemp("", "idemgrpc-chargesvc-")
		if err != nil {
			chargesvc.err = err
			return
		}
		chargesvc.bin = filepath.Join(dir, "chargesvc")
		out, err := exec.Command("go", "build", "-buildvcs=false", "-o", chargesvc.bin, "./testdata/chargesvc").CombinedOutput()
		if err != nil {
			chargesvc.err = fmt.Errorf("go build ./testdata/chargesvc: %w: %s", err, out)
		}
	})
	require.NoError(t, chargesvc.err)
	return chargesvc.bin
}

// server is one running chargesvc.
type server struct {
	cmd    *exec.Cmd
	stderr *testfixture.Buffer
	exited chan struct{}
}

// startServer starts chargesvc and waits until it listens; what it reports
// of the calls that waited goes to waited. It runs in the test's
// goroutine or another (the restarts), so it reports what went wrong
// rather than failing the test; the process is killed when the test ends.
func startServer(t *testing.T, bin string, waited *waitLog, args ...string) (*server, error) {
	s := &server{cmd: exec.Command(bin, args...), stderr: &testfixture.Buffer{}, exited: make(chan struct{})}
	s.cmd.Stderr = s.stderr
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	lines := make(chan string, 1)
	go func() {
		r := bufio.NewReader(stdout)
		line, _ := r.ReadString('\n')
		lines <- line
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if f := strings.Fields(line); len(f) == 3 && f[0] == "waited" {
				if d, err := time.ParseDuration(f[1]); err == nil {
					waited.add(d, f[2])
				}
			}
		}
	}()
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(s.kill)
	select {
	case line := <-lines:
		if !strings.HasPrefix(line, "listening") {
			return nil, fmt.Errorf("chargesvc did not start (%q): %s", line, s.stderr)
		}
	case <-time.After(2 * time.Minute):
		return nil, fmt.Errorf("chargesvc did not start: %s", s.stderr)
	}
	return s, nil
}

// waitLog gathers what the servers report of the calls that waited for
// the attempt of their key in flight.
type waitLog struct {
	mu     sync.Mutex
	waits  []time.Duration
	byKind map[string]int
}

func (w *waitLog) add(d time.Duration, kind string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.waits = append(w.waits, d)
	w.byKind[kind]++
}

// summary says how many calls waited, what they got, and how long they
// waited (p50, p99, max).
func (w *waitLog) summary() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.waits) == 0 {
		return "no call waited"
	}
	ds := append([]time.Duration(nil), w.waits...)
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return fmt.Sprintf("%d calls waited for the attempt in flight, then got %v; waited p50 %s p99 %s max %s",
		len(ds), w.byKind, ds[len(ds)/2].Round(time.Millisecond), ds[len(ds)*99/100].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond))
}

// kill ends the process with SIGKILL and waits for it.
func (s *server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// cardNetwork is a card network that deduplicates charges on their
// idempotency key, and fails some calls before doing anything, hangs some,
// and drops the connection of some after charging.
type cardNetwork struct {
	mu      sync.Mutex
	charges map[string]string // downstream key -> the call's ref
	faults  atomic.Bool
	failed  atomic.Int64
	hung    atomic.Int64
	dropped atomic.Int64
}

func newCardNetwork(t *testing.T) (*cardNetwork, string) {
	n := &cardNetwork{charges: map[string]string{}}
	n.faults.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Ref string `json:"ref"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		roll := rand.IntN(100)
		faults := n.faults.Load()
		switch {
		case faults && roll < 3: // fails, nothing done
			n.failed.Add(1)
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		case faults && roll < 5: // hangs until the caller gives up
			n.hung.Add(1)
			<-r.Context().Done()
			return
		}
		key := r.Header.Get("Idempotency-Key")
		n.mu.Lock()
		if _, ok := n.charges[key]; !ok {
			n.charges[key] = body.Ref
		}
		n.mu.Unlock()
		if faults && roll < 8 { // charged, and the answer is lost
			n.dropped.Add(1)
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				_ = conn.Close()
			}
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"id": "ch_" + key[:12]})
	}))
	t.Cleanup(srv.Close)
	return n, srv.URL
}

// chargesByRef counts the distinct charges made for each call.
func (n *cardNetwork) chargesByRef() map[string]int {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[string]int{}
	for _, ref := range n.charges {
		out[ref]++
	}
	return out
}

// dropProxy forwards TCP connections to the server's address, and drops
// them all when told to.
type dropProxy struct {
	lis     net.Listener
	backend string
	mu      sync.Mutex
	conns   map[net.Conn]bool
	drops   atomic.Int64
}

func newDropProxy(t *testing.T, backend string) *dropProxy {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &dropProxy{lis: lis, backend: backend, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { _ = lis.Close(); p.drop() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go p.forward(c)
		}
	}()
	return p
}

func (p *dropProxy) forward(c net.Conn) {
	s, err := net.Dial("tcp", p.backend)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[s] = true, true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(s, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, s); done <- struct{}{} }()
	<-done
	_ = c.Close()
	_ = s.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, s)
	p.mu.Unlock()
}

// drop closes every connection through the proxy.
func (p *dropProxy) drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.conns) > 0 {
		p.drops.Add(1)
	}
	for c := range p.conns {
		_ = c.Close()
	}
}

// freeAddr returns a loopback address nothing listens on, for a server
// restarted on the same port.
func freeAddr(t *testing.T) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close())
	return addr
}

// keyOf records the key UnaryClientInterceptor gave a call, in the slot
// the call's context carries: the key the test retries it with if the
// channel gives up.
type keySlot struct{}

func recordKey(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if slot, ok := ctx.Value(keySlot{}).(*string); ok {
		md, _ := metadata.FromOutgoingContext(ctx)
		*slot = idemgrpc.ResponseKey(md)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// grpc-go's own retry policy, as ServiceConfig writes it, with
// UnaryClientInterceptor's keys, against a server process killed with
// SIGKILL and restarted (as the same pgstore instance) while connections
// are dropped and the card network fails, hangs and loses answers: no call
// ends ABORTED, and every call is charged exactly once and makes exactly
// one order, once the calls the channel gave up on are sent again by hand
// with their keys.
func TestRetryPolicyThroughKills(t *testing.T) {
	t.Parallel()
	bin := chargesvcBin(t)
	schema := pgtest.NewMigratedSchema(t)
	_, err := schema.Pool.Exec(context.Background(), `CREATE TABLE kill_orders (id bigserial PRIMARY KEY,
		key_id bigint REFERENCES idem_keys (id) ON DELETE SET NULL, ref text NOT NULL, charge_id text)`)
	require.NoError(t, err)
	network, networkURL := newCardNetwork(t)
	addr := freeAddr(t)
	args := []string{"-db", schema.URL, "-schema", schema.Name, "-network", networkURL, "-addr", addr, "-instance", "chargesvc-1"}
	if w := os.Getenv("IDEMGRPC_KILL_DEFAULT_WAIT"); w != "" {
		args = append(args, "-default-wait", w) // to measure other waits; the test asserts the default
	}
	waited := &waitLog{byKind: map[string]int{}}
	srv, err := startServer(t, bin, waited, args...)
	require.NoError(t, err)
	proxy := newDropProxy(t, addr)

	sc, err := idemgrpc.ServiceConfig("idemgrpc.test.v1.Orders")
	require.NoError(t, err)
	conn, err := grpc.NewClient(proxy.lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(sc),
		grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil), recordKey))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	client := testpb.NewOrdersClient(conn)

	const calls, concurrency, kills = 300, 8, 3
	const callTimeout = 10 * time.Second
	type result struct {
		key  string
		code codes.Code
		why  string // the status's reason, or its message
		took time.Duration
	}
	results := make([]result, calls)
	var completed atomic.Int64
	next := make(chan int)
	go func() {
		for i := range calls {
			next <- i
		}
		close(next)
	}()

	// The faults: SIGKILL and a restart at a quarter, a half and three
	// quarters of the calls, and every connection dropped every second.
	stop := make(chan struct{})
	faultsDone := make(chan struct{})
	var restarts []time.Duration
	var restartErr error
	go func() {
		defer close(faultsDone)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		killed := 0
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				proxy.drop()
			}
			if killed < kills && completed.Load() >= int64((killed+1)*calls/(kills+1)) {
				killed++
				began := time.Now()
				srv.kill()
				if srv, restartErr = startServer(t, bin, waited, args...); restartErr != nil {
					return
				}
				restarts = append(restarts, time.Since(began))
			}
		}
	}()

	began := time.Now()
	var wg sync.WaitGroup
	for range concurrency {
		wg.Go(func() {
			for i := range next {
				var key string
				ctx, cancel := context.WithTimeout(context.WithValue(t.Context(), keySlot{}, &key), callTimeout)
				start := time.Now()
				_, err := client.CreateOrder(ctx, &testpb.CreateOrderRequest{Sku: "call-" + strconv.Itoa(i), Quantity: 1})
				cancel()
				st := status.Convert(err)
				why := st.Message()
				if info := errorInfo(st); info != nil {
					why = info.GetReason()
				}
				results[i] = result{key: key, code: st.Code(), why: why, took: time.Since(start)}
				completed.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(began)
	close(stop)
	<-faultsDone
	require.NoError(t, restartErr)

	byCode := map[codes.Code]int{}
	var took []time.Duration
	for i, r := range results {
		byCode[r.code]++
		took = append(took, r.took)
		if r.code != codes.OK {
			t.Logf("call %d ended %s (%s) after %s", i, r.code, r.why, r.took.Round(time.Millisecond))
		}
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	t.Logf("%d calls at concurrency %d in %s: final codes %v; %d kills (restart took %v), %d connection drops; card network: %d failed, %d hung, %d answers lost; call p50 %s p99 %s max %s",
		calls, concurrency, elapsed.Round(time.Millisecond), byCode, len(restarts), restarts, proxy.drops.Load(),
		network.failed.Load(), network.hung.Load(), network.dropped.Load(),
		took[calls/2].Round(time.Millisecond), took[calls*99/100].Round(time.Millisecond), took[calls-1].Round(time.Millisecond))
	t.Logf("the server's wait (DefaultWait %q): %s", os.Getenv("IDEMGRPC_KILL_DEFAULT_WAIT"), waited.summary())
	require.Zero(t, byCode[codes.Aborted], "no call ends ABORTED: %v", byCode)

	// The calls the channel gave up on are sent again, by hand, with
	// their keys, with the faults off: each gets its answer.
	network.faults.Store(false)
	handRetried := 0
	for i, r := range results {
		if r.code == codes.OK {
			continue
		}
		require.NotEmpty(t, r.key, "call %d has a key", i)
		handRetried++
		require.Eventually(t, func() bool {
			ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(t.Context(), idemgrpc.MetadataKey, r.key), callTimeout)
			defer cancel()
			_, err := client.CreateOrder(ctx, &testpb.CreateOrderRequest{Sku: "call-" + strconv.Itoa(i), Quantity: 1})
			return err == nil
		}, 2*time.Minute, 100*time.Millisecond, "call %d", i)
	}

	// Exactly one effect per call: one order, one charge.
	charges := network.chargesByRef()
	rows, err := schema.Pool.Query(context.Background(), `SELECT ref, count(*) FROM kill_orders GROUP BY ref`)
	require.NoError(t, err)
	orders := map[string]int{}
	for rows.Next() {
		var ref string
		var n int
		require.NoError(t, rows.Scan(&ref, &n))
		orders[ref] = n
	}
	require.NoError(t, rows.Err())
	require.Len(t, orders, calls)
	require.Len(t, charges, calls)
	for i := range calls {
		ref := "call-" + strconv.Itoa(i)
		require.Equal(t, 1, orders[ref], "orders of %s", ref)
		require.Equal(t, 1, charges[ref], "charges of %s", ref)
	}
	t.Logf("sent again by hand after the channel gave up: %d; orders and charges: exactly one per call", handRetried)
}
