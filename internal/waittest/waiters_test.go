// Package waittest runs the service in testdata/svc as two processes on one
// database and checks retries that wait for the request already running
// with their key (Prefer: wait): they get its stored answer, woken across
// processes by one notification, or 409 when it does not finish in time,
// and a first request killed mid-flow is taken over and finished once.
package waittest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/internal/hooks"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/internal/testfixture"
	_ "github.com/go-idem/idem/pgstore" // installs hooks.StoreChannel
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// deadline bounds every wait of these tests: generous, for a loaded machine.
const deadline = 2 * time.Minute

var build struct {
	once sync.Once
	bin  string
	err  error
	dir  string
}

// svc builds testdata/svc once per test binary.
func svc(t *testing.T) string {
	t.Helper()
	build.once.Do(func() {
		build.dir, build.err = os.MkdirTemp("", "idem-waittest-")
		if build.err != nil {
			return
		}
		build.bin = filepath.Join(build.dir, "svc")
		cmd := exec.Command("go", "build", "-buildvcs=false", "-o", build.bin, "./testdata/svc")
		out, err := cmd.CombinedOutput()
		if err != nil {
			build.err = fmt.Errorf("go build ./testdata/svc: %w: %s", err, out)
		}
	})
	require.NoError(t, build.err)
	return build.bin
}

// provider is a payment provider that deduplicates charges on their
// idempotency key and holds every call until the test opens its gate.
type provider struct {
	mu      sync.Mutex
	charges map[string]string
	calls   int
	arrived chan struct{}
	gate    chan struct{}
	open    sync.Once
}

func newProvider(t *testing.T) (*provider, string) {
	p := &provider{charges: map[string]string{}, arrived: make(chan struct{}, 100), gate: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.calls++
		p.mu.Unlock()
		p.arrived <- struct{}{}
		select {
		case <-p.gate:
		case <-r.Context().Done():
			return
		}
		key := r.Header.Get("Idempotency-Key")
		p.mu.Lock()
		id, ok := p.charges[key]
		if !ok {
			id = fmt.Sprintf("ch_%d", len(p.charges)+1)
			p.charges[key] = id
		}
		p.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]string{"id": id})
	}))
	t.Cleanup(func() { p.release(); srv.Close() })
	return p, srv.URL
}

func (p *provider) release() { p.open.Do(func() { close(p.gate) }) }

func (p *provider) distinctCharges() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charges)
}

// proc is one running svc.
type proc struct {
	cmd    *exec.Cmd
	url    string
	stderr *testfixture.Buffer
	exited chan struct{}
}

func start(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), stderr: &testfixture.Buffer{}, exited: make(chan struct{})}
	p.cmd.Stderr = p.stderr
	stdout, err := p.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, p.cmd.Start())
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- line
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(p.kill)
	select {
	case line := <-lines:
		_, err := fmt.Sscanf(line, "listening %s", &p.url)
		require.NoError(t, err, "svc did not start (%q): %s", line, p.stderr)
	case <-time.After(deadline):
		t.Fatalf("svc did not start within %s: %s", deadline, p.stderr)
	}
	return p
}

// kill ends the process with SIGKILL and waits for it.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

type stats struct {
	InProgress    int64 `json:"in_progress"`
	Events        int64 `json:"in_progress_events"`
	Notifications int64 `json:"notifications"`
	Listening     bool  `json:"listening"`
	Polling       bool  `json:"polling"`
}

func (p *proc) stats(t *testing.T) stats {
	t.Helper()
	res, err := http.Get(p.url + "/stats")
	require.NoError(t, err)
	defer res.Body.Close()
	var s stats
	require.NoError(t, json.NewDecoder(res.Body).Decode(&s))
	return s
}

// answer is what one request got.
type answer struct {
	status  int
	body    string
	header  http.Header
	took    time.Duration
	ended   time.Time
	err     error
	replays bool
}

var client = &http.Client{Timeout: deadline}

func post(url, key, prefer string) answer {
	req, err := http.NewRequest(http.MethodPost, url+"/orders", strings.NewReader(fmt.Sprintf(`{"ref": %q}`, key)))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	if prefer != "" {
		req.Header.Set("Prefer", prefer)
	}
	began := time.Now()
	res, err := client.Do(req)
	if err != nil {
		return answer{err: err, took: time.Since(began)}
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	return answer{status: res.StatusCode, body: string(body), header: res.Header, took: time.Since(began), ended: time.Now(), err: err,
		replays: res.Header.Get("Idempotent-Replayed") == "true"}
}

// bench is a migrated schema, a provider and the processes on them.
type bench struct {
	schema   *pgtest.Schema
	provider *provider
	procs    []*proc
}

func setup(t *testing.T, n int, args ...string) *bench {
	t.Helper()
	bin := svc(t)
	schema := pgtest.NewMigratedSchema(t)
	_, err := schema.Pool.Exec(context.Background(), `CREATE TABLE svc_orders (id bigserial PRIMARY KEY, ref text NOT NULL)`)
	require.NoError(t, err)
	prov, provURL := newProvider(t)
	b := &bench{schema: schema, provider: prov}
	for range n {
		b.procs = append(b.procs, start(t, bin, append([]string{"-db", schema.URL, "-schema", schema.Name, "-provider", provURL}, args...)...))
	}
	return b
}

// waitFor polls cond until it holds, failing the test at deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, deadline, 5*time.Millisecond, "waiting for %s", what)
}

func (b *bench) inProgress(t *testing.T) int64 {
	var n int64
	for _, p := range b.procs {
		n += p.stats(t).InProgress
	}
	return n
}

func (b *bench) orders(t *testing.T) int {
	var n int
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(), `SELECT count(*) FROM svc_orders`).Scan(&n))
	return n
}

// listen counts the notifications sent on the schema's channel.
func listen(t *testing.T, schema *pgtest.Schema) *atomic.Int64 {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, schema.URL)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{hooks.StoreChannel(schema.Name)}.Sanitize())
	require.NoError(t, err)
	var n atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := conn.WaitForNotification(ctx); err != nil {
				return
			}
			n.Add(1)
		}
	}()
	t.Cleanup(func() { cancel(); <-done; _ = conn.Close(context.Background()) })
	return &n
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(int(float64(len(s))*p), len(s)-1)]
}

// Fifty retries of a request in flight, over two processes, wait for it
// and each gets its exact bytes, replayed; the database sent one
// notification for all of them.
func TestFiftyWaitersGetTheFirstAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	sent := listen(t, b.schema)
	const waiters = 50

	first := make(chan answer, 1)
	go func() { first <- post(b.procs[0].url, "k-50", "") }()
	<-b.provider.arrived

	answers := make(chan answer, waiters)
	for i := range waiters {
		go func() { answers <- post(b.procs[i%2].url, "k-50", "wait=60") }()
	}
	waitFor(t, "every waiter to find the key in progress", func() bool { return b.inProgress(t) >= waiters })
	waitFor(t, "the key to be marked as waited for", func() bool {
		var marked bool
		require.NoError(t, b.schema.Pool.QueryRow(context.Background(), `SELECT waited_at IS NOT NULL FROM idem_leases`).Scan(&marked))
		return marked
	})
	waitFor(t, "both processes to listen", func() bool { return b.procs[0].stats(t).Listening && b.procs[1].stats(t).Listening })
	opened := time.Now()
	b.provider.release()

	one := <-first
	require.NoError(t, one.err)
	require.Equal(t, http.StatusCreated, one.status, one.body)
	require.False(t, one.replays)
	var took, woke []time.Duration
	for range waiters {
		a := <-answers
		require.NoError(t, a.err)
		require.Equal(t, http.StatusCreated, a.status, a.body)
		require.Equal(t, one.body, a.body, "the first request's bytes")
		require.True(t, a.replays, "Idempotent-Replayed: true")
		require.Equal(t, "wait=30", a.header.Get("Preference-Applied"), "the wait granted: 60 asked, capped by MaxWait (30s)")
		took, woke = append(took, a.took), append(woke, a.ended.Sub(opened))
	}
	waitFor(t, "the notification", func() bool { return sent.Load() >= 1 })
	require.Equal(t, int64(1), sent.Load(), "one notification for every waiter")
	s0, s1 := b.procs[0].stats(t), b.procs[1].stats(t)
	received := []int64{s0.Notifications, s1.Notifications}
	require.Positive(t, s0.Notifications, "each process is woken by the notification")
	require.Positive(t, s1.Notifications, "each process is woken by the notification")
	// How fast they woke is logged, not asserted: a timing bound belongs in
	// a benchmark, and the notifications each process received say what
	// woke them.
	t.Logf("in-progress answers on the way: %d for %d waiters", s0.Events+s1.Events, waiters)
	require.Equal(t, 1, b.orders(t))
	require.Equal(t, 1, b.provider.distinctCharges())
	t.Logf("waiters: %d over 2 processes; notifications sent: %d (received per process: %v); wait p50 %s p99 %s; wake after the finish p50 %s p99 %s",
		waiters, sent.Load(), received, percentile(took, .5).Round(time.Millisecond), percentile(took, .99).Round(time.Millisecond),
		percentile(woke, .5).Round(time.Millisecond), percentile(woke, .99).Round(time.Millisecond))
}

// A waiter whose wait passes before the first request finishes gets the
// 409 it gets without waiting, saying it waited; one that did not ask gets
// it at once, without Preference-Applied.
func TestWaitThatPassesGets409(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	first := make(chan answer, 1)
	go func() { first <- post(b.procs[0].url, "k-409", "") }()
	<-b.provider.arrived

	a := post(b.procs[1].url, "k-409", "respond-async, WAIT=1")
	require.NoError(t, a.err)
	require.Equal(t, http.StatusConflict, a.status, a.body)
	require.Equal(t, "wait=1", a.header.Get("Preference-Applied"))
	require.NotEmpty(t, a.header.Get("Retry-After"))
	require.GreaterOrEqual(t, a.took, time.Second)

	a = post(b.procs[1].url, "k-409", "")
	require.Equal(t, http.StatusConflict, a.status, a.body)
	require.Empty(t, a.header.Get("Preference-Applied"))

	b.provider.release()
	one := <-first
	require.Equal(t, http.StatusCreated, one.status, one.body)
	a = post(b.procs[1].url, "k-409", "wait=5")
	require.Equal(t, one.body, a.body)
	require.True(t, a.replays)
	require.Empty(t, a.header.Get("Preference-Applied"), "nothing to wait for: the preference did not apply")
}

// The first request's process is killed mid-flow (in its provider call):
// the waiters on the other process wake when its lease runs out, one takes
// the key over and finishes it, and every waiter gets that answer. The
// order is made once and charged once.
func TestFirstRequestKilledMidFlow(t *testing.T) {
	t.Parallel()
	b := setup(t, 2, "-lease", "3s")
	const waiters = 10
	go func() { _ = post(b.procs[0].url, "k-kill", "") }()
	<-b.provider.arrived

	answers := make(chan answer, waiters)
	for range waiters {
		go func() { answers <- post(b.procs[1].url, "k-kill", "wait=60") }()
	}
	waitFor(t, "every waiter to find the key in progress", func() bool { return b.procs[1].stats(t).InProgress >= waiters })
	b.procs[0].kill()
	b.provider.release()

	var executed, replayed int
	var body string
	for range waiters {
		a := <-answers
		require.NoError(t, a.err)
		if a.status == http.StatusConflict {
			continue // its wait passed: allowed, never a second execution
		}
		require.Equal(t, http.StatusCreated, a.status, a.body)
		if body == "" {
			body = a.body
		}
		require.Equal(t, body, a.body)
		if a.replays {
			replayed++
		} else {
			executed++
		}
	}
	require.Equal(t, 1, executed, "one waiter took the key over and finished it")
	require.Equal(t, 1, b.orders(t), "the order was made once")
	require.Equal(t, 1, b.provider.distinctCharges(), "and charged once")
	t.Logf("killed mid-flow: %d waiters, 1 took over and finished, %d replayed its answer", waiters, replayed)
}

// With LISTEN off (pgstore.WaitPoll), waiters poll, once per key
// and process, and get the same answer; nothing is notified.
func TestWaitersPoll(t *testing.T) {
	t.Parallel()
	b := setup(t, 2, "-polling")
	sent := listen(t, b.schema)
	const waiters = 10
	first := make(chan answer, 1)
	go func() { first <- post(b.procs[0].url, "k-poll", "") }()
	<-b.provider.arrived
	answers := make(chan answer, waiters)
	for i := range waiters {
		go func() { answers <- post(b.procs[i%2].url, "k-poll", "wait=60") }()
	}
	waitFor(t, "every waiter to find the key in progress", func() bool { return b.inProgress(t) >= waiters })
	b.provider.release()
	one := <-first
	require.Equal(t, http.StatusCreated, one.status, one.body)
	var took []time.Duration
	for range waiters {
		a := <-answers
		require.NoError(t, a.err)
		require.Equal(t, one.body, a.body)
		require.True(t, a.replays)
		took = append(took, a.took)
	}
	require.Zero(t, sent.Load(), "a polling process marks nothing, so nothing is notified")
	s0, s1 := b.procs[0].stats(t), b.procs[1].stats(t)
	require.Zero(t, s0.Notifications+s1.Notifications)
	require.True(t, s0.Polling && s1.Polling, "both processes poll")
	require.False(t, s0.Listening || s1.Listening)
	t.Logf("polling: %d waiters, wait p50 %s p99 %s", waiters, percentile(took, .5).Round(time.Millisecond), percentile(took, .99).Round(time.Millisecond))
}
