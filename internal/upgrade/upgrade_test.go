// Package upgrade_test runs the previous release and this tree against one
// database, as an upgrade does: the previous release's binary is built from
// git (a worktree of its tag), both builds run the service in testdata/svc
// as real processes, and the test follows docs/operations.md, "Upgrading to
// v0.2": drain, migrate, deploy; a previous-release process left running
// fails closed.
package upgrade_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/internal/testfixture"
	"github.com/go-idem/idem/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The previous release: its tag, and the commit the tag names, for a clone
// that has the commit but not the tag.
const (
	previousTag    = "v0.1.0"
	previousCommit = "4b9ca6a14b6324553a1b6649c2af0011e0518176"
	// previousSchema is the schema version the previous release knows.
	previousSchema = 6
)

// deadline bounds each wait of the test; it only stops a hang.
const deadline = 2 * time.Minute

// lease is the services' idem lease: how long a killed process's keys wait
// before another process takes them over.
const lease = 4 * time.Second

// loudSkip skips with a note that a run without the upgrade test cannot be
// mistaken for one that ran it.
func loudSkip(t *testing.T, format string, args ...any) {
	t.Helper()
	bar := strings.Repeat("!", 80)
	note := fmt.Sprintf("\n%s\n!!! %s SKIPPED: THE PREVIOUS RELEASE COULD NOT BE BUILT, NO UPGRADE WAS TESTED.\n!!! %s\n%s\n",
		bar, t.Name(), fmt.Sprintf(format, args...), bar)
	fmt.Fprint(os.Stderr, note)
	t.Skip(note)
}

func git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return strings.TrimSpace(string(out)), nil
}

// builds are the service built from the previous release and from this
// tree.
type builds struct {
	previous, head string
	commit         string // the previous release's commit
}

// build checks out the previous release in a git worktree under
// t.TempDir (removed when the test ends), copies testdata/svc into it and
// builds it there with that tree's go.work, then builds this tree's.
func build(t *testing.T) *builds {
	t.Helper()
	here, err := os.Getwd()
	require.NoError(t, err)
	goTool, err := exec.LookPath("go")
	require.NoError(t, err, "the upgrade test builds with the go command, which must be on PATH")
	if _, err := exec.LookPath("git"); err != nil {
		loudSkip(t, "git is not on PATH: %v", err)
	}
	if _, err := git(here, "rev-parse", "--show-toplevel"); err != nil {
		loudSkip(t, "not a git checkout: %v", err)
	}
	commit, err := git(here, "rev-parse", "--verify", "--quiet", previousTag+"^{commit}")
	if err != nil {
		commit, err = git(here, "rev-parse", "--verify", "--quiet", previousCommit+"^{commit}")
	}
	if err != nil {
		loudSkip(t, "neither the tag %s nor the commit %s is in this clone (a shallow clone? `git fetch --tags --unshallow`): %v",
			previousTag, previousCommit, err)
	}
	dir := t.TempDir()
	tree := filepath.Join(dir, "previous")
	if _, err := git(here, "worktree", "add", "--detach", tree, commit); err != nil {
		loudSkip(t, "cannot check out %s: %v", commit, err)
	}
	t.Cleanup(func() {
		if _, err := git(here, "worktree", "remove", "--force", tree); err != nil {
			t.Errorf("%v", err)
		}
		if _, err := git(here, "worktree", "prune"); err != nil {
			t.Errorf("%v", err)
		}
	})
	source, err := os.ReadFile(filepath.Join("testdata", "svc", "main.go"))
	require.NoError(t, err)
	pkg := filepath.Join("internal", "upgrade", "testdata", "svc")
	require.NoError(t, os.MkdirAll(filepath.Join(tree, pkg), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(tree, pkg, "main.go"), source, 0o644))

	b := &builds{previous: filepath.Join(dir, "svc-previous"), head: filepath.Join(dir, "svc-head"), commit: commit}
	for _, one := range []struct{ dir, out, pkg, work string }{
		{tree, b.previous, "./" + filepath.ToSlash(pkg), filepath.Join(tree, "go.work")},
		{here, b.head, "./testdata/svc", ""},
	} {
		cmd := exec.Command(goTool, "build", "-buildvcs=false", "-o", one.out, one.pkg)
		cmd.Dir = one.dir
		cmd.Env = os.Environ()
		if one.work != "" {
			// The previous tree's own workspace, not one GOWORK may name.
			if _, err := os.Stat(one.work); err != nil {
				one.work = "off"
			}
			cmd.Env = append(cmd.Env, "GOWORK="+one.work)
		}
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go build in %s: %s", one.dir, out)
	}
	return b
}

// provider is a payment provider that deduplicates on the idempotency key
// and counts the charges made for each order reference. A reference put on
// hold is charged, then answered never: the caller is killed while it
// waits, the worst moment for a double charge.
type provider struct {
	mu      sync.Mutex
	byKey   map[string]string // idempotency key -> charge id
	charges map[string]int    // ref -> charges made
	hold    map[string]bool
	held    chan string
	server  *httptest.Server
}

func newProvider(t *testing.T) *provider {
	p := &provider{byKey: map[string]string{}, charges: map[string]int{}, hold: map[string]bool{}, held: make(chan string, 64)}
	p.server = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.server.Close)
	return p
}

func (p *provider) serve(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Ref string `json:"ref"`
	}
	key := r.Header.Get("Idempotency-Key")
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || key == "" || in.Ref == "" {
		http.Error(w, "bad charge", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	id, seen := p.byKey[key]
	if !seen {
		p.charges[in.Ref]++
		id = fmt.Sprintf("ch_%d", len(p.byKey)+1)
		p.byKey[key] = id
	}
	hold := p.hold[in.Ref]
	delete(p.hold, in.Ref)
	p.mu.Unlock()
	if hold {
		p.held <- in.Ref
		<-r.Context().Done() // the caller dies waiting
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"id": id})
}

func (p *provider) holdRefs(refs []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range refs {
		p.hold[r] = true
	}
}

func (p *provider) chargesOf(ref string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.charges[ref]
}

// proc is a running service process.
type proc struct {
	name   string
	cmd    *exec.Cmd
	url    string
	schema int // the schema version it found at start, after migrating
	knows  int // migrations.Latest() of its build
	stderr *testfixture.Buffer
	exited chan struct{}
}

func svcArgs(dbURL, providerURL string, migrate bool) []string {
	return []string{"-db", dbURL, "-provider", providerURL, "-lease", lease.String(), fmt.Sprintf("-migrate=%t", migrate)}
}

// start runs a service and waits for it to listen; it fails the test when the
// process ends first.
func start(t *testing.T, name, bin string, args []string) *proc {
	t.Helper()
	p, err := launch(name, bin, args)
	require.NoError(t, err)
	t.Cleanup(p.kill)
	return p
}

func launch(name, bin string, args []string) (*proc, error) {
	p := &proc{name: name, cmd: exec.Command(bin, args...), stderr: &testfixture.Buffer{}, exited: make(chan struct{})}
	p.cmd.Stderr = p.stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- line
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	select {
	case line := <-lines:
		if _, err := fmt.Sscanf(line, "listening %s schema=%d knows=%d", &p.url, &p.schema, &p.knows); err != nil {
			<-p.exited
			return p, fmt.Errorf("%s did not start (%q): %s", name, line, p.stderr)
		}
		return p, nil
	case <-time.After(deadline):
		p.kill()
		return p, fmt.Errorf("%s did not start within %s: %s", name, deadline, p.stderr)
	}
}

// kill ends the process with SIGKILL and waits for it.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// answer is what a request got in the end, and how many tries it took.
type answer struct {
	status   int
	body     string
	replayed bool
	tries    int
	errors   int // answers 500 and up on the way (a retryable failure)
}

var client = &http.Client{Timeout: deadline}

func post(ctx context.Context, url, ref string) (*http.Response, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/orders", strings.NewReader(fmt.Sprintf(`{"ref": %q}`, ref)))
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", ref)
	resp, err := client.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, string(body), err
}

// finish sends the request for ref to url until it gets 201, as a client
// retrying with its key does: 409 while another process's lease holds the
// key, a retryable 5xx, and anything else fails the test.
func finish(t *testing.T, url, ref string) answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	var a answer
	for {
		a.tries++
		resp, body, err := post(ctx, url, ref)
		require.NoError(t, err, "%s at %s", ref, url)
		switch {
		case resp.StatusCode == http.StatusCreated:
			a.status, a.body, a.replayed = resp.StatusCode, body, resp.Header.Get("Idempotent-Replayed") == "true"
			return a
		case resp.StatusCode >= 500:
			a.errors++
			t.Logf("%s at %s: %d %s (retried)", ref, url, resp.StatusCode, body)
		case resp.StatusCode != http.StatusConflict:
			require.Failf(t, "unexpected answer", "%s at %s: %d %s", ref, url, resp.StatusCode, body)
		}
		select {
		case <-ctx.Done():
			require.Failf(t, "no answer", "%s at %s: still %d after %s", ref, url, resp.StatusCode, deadline)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// strand sends the requests for refs to p with the provider holding their
// charges, waits until the provider has charged each, and kills p with
// SIGKILL: the keys are left in flight at the charge, charged, unanswered.
func strand(t *testing.T, prov *provider, p *proc, refs []string) {
	t.Helper()
	prov.holdRefs(refs)
	var wg sync.WaitGroup
	for _, ref := range refs {
		wg.Go(func() { _, _, _ = post(context.Background(), p.url, ref) }) // ends when p dies
	}
	timeout := time.After(deadline)
	for range refs {
		select {
		case <-prov.held:
		case <-timeout:
			require.Failf(t, "charges not made", "%s did not reach the provider within %s: %s", p.name, deadline, p.stderr)
		}
	}
	p.kill()
	wg.Wait()
}

func refs(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i+1)
	}
	return out
}

// The upgrade from the previous release, with real processes against one
// database: v0.1.0 serves; this tree's migration refuses while v0.1.0 has
// keys in flight, naming the procedure; v0.1.0 drains them; this tree
// migrates and serves, replaying the keys v0.1.0 finished (never 422); a
// v0.1.0 process still running, and one restarted, fail closed (503) and
// run nothing; this tree takes over its own keys left in flight. Every key
// ends with one order and one charge.
func TestUpgradeFromThePreviousRelease(t *testing.T) {
	ctx := context.Background()
	bins := build(t)
	schema := pgtest.NewSchema(t)
	_, err := schema.Pool.Exec(ctx, `CREATE TABLE svc_orders (id bigserial PRIMARY KEY, ref text NOT NULL)`)
	require.NoError(t, err)
	prov := newProvider(t)
	args := func(migrate bool) []string { return svcArgs(schema.URL, prov.server.URL, migrate) }
	var report []string
	say := func(format string, a ...any) { report = append(report, fmt.Sprintf(format, a...)) }
	all := map[string]bool{}
	bodies := map[string]string{}
	// serveAll has p run the requests for rs to the end; it returns the
	// tries it took.
	serveAll := func(p *proc, rs []string) (tries int) {
		for _, ref := range rs {
			a := finish(t, p.url, ref)
			require.False(t, a.replayed, "%s ran, not replayed", ref)
			tries += a.tries
			all[ref], bodies[ref] = true, a.body
		}
		return tries
	}

	// v0.1.0 on an empty database migrates it to its schema and serves.
	prevA := start(t, "previous A", bins.previous, args(true))
	require.Equal(t, previousSchema, prevA.knows, "the previous build knows schema %d", previousSchema)
	require.Equal(t, previousSchema, prevA.schema)
	prevB := start(t, "previous B", bins.previous, args(false)) // keeps running across the upgrade
	finishedByPrevious := refs("prev-finished", 3)
	serveAll(prevB, finishedByPrevious)

	// This tree does not run on the previous schema: it refuses at start.
	_, err = launch("HEAD on 6", bins.head, args(false))
	require.ErrorContains(t, err, fmt.Sprintf("the schema is at version %d and this code needs %d", previousSchema, migrations.Latest()))

	// Keys in flight by v0.1.0 (charged, its process killed): the
	// migration refuses, with the stable IDEM1 error naming the procedure.
	inFlight := refs("prev-inflight", 3)
	strand(t, prov, prevA, inFlight)
	_, err = launch("HEAD migrating with keys in flight", bins.head, args(true))
	require.ErrorContains(t, err, "migrations: the migration refused to run: 0007_v02_format: idem: 3 keys are unfinished")
	require.ErrorContains(t, err, "Upgrading to v0.2")
	refusal, _, _ := strings.Cut(err.Error()[strings.Index(err.Error(), "0007_v02_format"):], "\n")
	var version int
	require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT max(version) FROM idem_migrations`).Scan(&version))
	require.Equal(t, previousSchema, version, "nothing was migrated")

	// Drained: v0.1.0 finishes its keys in flight (409 until the killed
	// process's lease runs out), each charged once.
	drainTries := serveAll(prevB, inFlight)
	finishedByPrevious = append(finishedByPrevious, inFlight...)

	// This tree migrates on start and serves.
	headA := start(t, "HEAD A", bins.head, args(true))
	require.Equal(t, migrations.Latest(), headA.schema, "HEAD migrated on start")
	serveAll(headA, refs("head", 3))

	// Keys v0.1.0 finished replay under this tree, byte for byte: never
	// 422, though this tree fingerprints requests another way.
	for _, ref := range finishedByPrevious {
		a := finish(t, headA.url, ref)
		require.True(t, a.replayed, "%s replays", ref)
		require.Equal(t, bodies[ref], a.body, "%s replays v0.1.0's answer", ref)
	}

	// v0.1.0 after the migration fails closed: the process that ran across
	// it, and one restarted on the new schema, answer 503 to a new key and
	// to a finished one, and run nothing; started migrating on start, it
	// refuses the schema ahead of it.
	prevC := start(t, "previous C (restarted)", bins.previous, args(false))
	refusedRefs := refs("prev-after", 2)
	closed := 0
	for _, p := range []*proc{prevB, prevC} {
		for _, ref := range []string{refusedRefs[0], refusedRefs[1], finishedByPrevious[0]} {
			resp, body, err := post(ctx, p.url, ref)
			require.NoError(t, err)
			require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s at %s: %s", ref, p.name, body)
			closed++
		}
	}
	_, err = launch("previous, migrating on start", bins.previous, args(true))
	require.ErrorContains(t, err, fmt.Sprintf("the database is at version %d, this binary knows up to %d", migrations.Latest(), previousSchema))
	out, err := exec.CommandContext(ctx, bins.previous, append(args(false), "-complete-once")...).CombinedOutput()
	require.Error(t, err, "v0.1.0's completer on the new schema: %s", out)

	// Keys in flight by this tree (charged, its process killed) are taken
	// over by another process of it once the lease runs out, each charged
	// once; then this tree serves what v0.1.0 refused.
	headB := start(t, "HEAD B", bins.head, args(false))
	fromHead := refs("head-inflight", 3)
	strand(t, prov, headA, fromHead)
	takeoverTries := serveAll(headB, fromHead)
	serveAll(headB, refusedRefs)

	// Each key: one order, one charge, finished.
	orders, charges, twice := 0, 0, 0
	for ref := range all {
		var n int
		require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT count(*) FROM svc_orders WHERE ref = $1`, ref).Scan(&n))
		require.Equal(t, 1, n, "orders for %s", ref)
		c := prov.chargesOf(ref)
		require.Equal(t, 1, c, "charges for %s", ref)
		if c > 1 {
			twice++
		}
		orders, charges = orders+n, charges+c
	}
	var unfinished int
	require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT count(*) FROM idem_keys WHERE status <> 'finished'`).Scan(&unfinished))
	require.Zero(t, unfinished)

	say("upgrade: %s (%s, schema %d) -> HEAD (schema %d); one database, lease %s", previousTag, bins.commit[:7], previousSchema, migrations.Latest(), lease)
	say("  v0.1.0 serving: %d keys finished", len(finishedByPrevious)-len(inFlight))
	say("  v0.1.0 left %d keys in flight (killed -9 after the provider charged): HEAD's migration refused: %s", len(inFlight), refusal)
	say("  drained: v0.1.0 finished them in %d tries (409 until the lease ran out)", drainTries)
	say("  migrated on HEAD's start to schema %d; HEAD serving", migrations.Latest())
	say("  keys v0.1.0 finished, retried on HEAD: %d of %d replayed byte for byte, 0 x 422", len(finishedByPrevious), len(finishedByPrevious))
	say("  v0.1.0 after the migration (running across it, and restarted): %d of %d requests 503, nothing run; migrating on start refused; its completer failed", closed, closed)
	say("  HEAD left %d keys in flight (killed -9 after the provider charged): another HEAD process finished them in %d tries", len(fromHead), takeoverTries)
	say("  audit: %d keys, %d orders, %d charges: %d charged twice, %d unfinished", len(all), orders, charges, twice, unfinished)
	t.Log("\n" + strings.Join(report, "\n"))
}
