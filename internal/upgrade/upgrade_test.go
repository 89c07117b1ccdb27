// Package upgrade_test runs the previous release and this tree against one
// database, as a rolling deploy does: the previous release's binary is built
// from git (a worktree of its tag), both builds run the service in
// testdata/svc as real processes, this tree migrates the schema while the
// previous release serves, and keys left in flight by a process of either
// build killed with SIGKILL are finished by the other, each charged once.
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

// The previous release and this tree against one database, as a rolling
// deploy runs them: the previous release serves on its schema; this tree
// migrates up while it serves; keys left in flight by a process of either
// build killed mid-charge are finished by the other; every key ends with
// one order and one charge.
func TestRollingUpgradeFromThePreviousRelease(t *testing.T) {
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
	// serveAll has p run the requests for rs to the end; it returns the
	// tries it took and the 5xx answers met on the way.
	serveAll := func(p *proc, rs []string) (tries, errs int) {
		for _, ref := range rs {
			a := finish(t, p.url, ref)
			require.False(t, a.replayed, "%s ran, not replayed", ref)
			tries, errs = tries+a.tries, errs+a.errors
			all[ref] = true
		}
		return tries, errs
	}
	served := func(p *proc, rs []string) int { _, errs := serveAll(p, rs); return errs }

	// The previous release on an empty database migrates it to its schema.
	prevA := start(t, "previous A", bins.previous, args(true))
	require.Equal(t, previousSchema, prevA.knows, "the previous build knows schema %d", previousSchema)
	require.Equal(t, previousSchema, prevA.schema)
	prevB := start(t, "previous B", bins.previous, args(false)) // keeps running across the upgrade
	warm := refs("prev-on-6", 3)
	require.Zero(t, served(prevB, warm))

	// This tree does not run on the previous schema: it refuses at start.
	_, err = launch("HEAD on 6", bins.head, args(false))
	require.ErrorContains(t, err, fmt.Sprintf("the schema is at version %d and this code needs %d", previousSchema, migrations.Latest()))
	headOn6 := fmt.Sprintf("refuses at start (needs %d)", migrations.Latest())

	// Keys in flight by the previous release: charged, then its process is
	// killed.
	fromPrevious := refs("prev-inflight", 4)
	strand(t, prov, prevA, fromPrevious)

	// This tree migrates up on start while the previous release serves.
	headA := start(t, "HEAD A", bins.head, args(true))
	require.Equal(t, migrations.Latest(), headA.schema, "HEAD migrated on start")

	// The previous release keeps working on the new schema: the process
	// that ran before the migration, and one started after it without
	// migrating. Starting it with a migration on start refuses (v0.1.0
	// predates compatibility floors).
	afterMigration := refs("prev-on-new", 3)
	prevErrs := served(prevB, afterMigration)
	prevC := start(t, "previous C", bins.previous, args(false))
	startedAfter := refs("prev-started-after", 2)
	prevErrs += served(prevC, startedAfter)
	_, err = launch("previous, migrating on start", bins.previous, args(true))
	require.ErrorContains(t, err, fmt.Sprintf("the database is at version %d, this binary knows up to %d", migrations.Latest(), previousSchema))

	// This tree finishes the keys the previous release left in flight.
	tries, _ := serveAll(headA, fromPrevious)

	// Keys in flight by this tree, finished by the previous release's
	// process that was started before the migration. This tree compares
	// what the client sent (the payload fingerprint) and keeps, beside it,
	// the fingerprint of the decoded input that v0.1.0 compares and derives
	// downstream keys from (migration 0009): v0.1.0 takes them over once
	// the killed process's lease runs out and sends the provider the
	// downstream key this tree sent, so each is charged once.
	headB := start(t, "HEAD B", bins.head, args(true))
	finishedByHead := refs("head", 2)
	require.Zero(t, served(headB, finishedByHead))
	fromHead := refs("head-inflight", 4)
	strand(t, prov, headB, fromHead)
	backTries, _ := serveAll(prevB, fromHead)

	// Finished keys replay across builds, byte for byte.
	replays := 0
	for _, pair := range []struct {
		ref      string
		from, to *proc
	}{{warm[0], prevB, headA}, {fromPrevious[0], headA, prevB}, {finishedByHead[0], headA, prevB}, {fromHead[0], prevB, headA}} {
		first := finish(t, pair.from.url, pair.ref)
		second := finish(t, pair.to.url, pair.ref)
		require.True(t, first.replayed && second.replayed, "%s replays", pair.ref)
		require.Equal(t, first.body, second.body, "%s replays the same answer on either build", pair.ref)
		replays++
	}

	// A release after this one, simulated by the row its migrations would
	// record: this tree, migrating on start, starts on it when the new
	// version's floor is this tree's schema (an expand), and refuses when
	// it is not (a contract), naming the release needed.
	next := migrations.Latest() + 1
	_, err = schema.Pool.Exec(ctx, `INSERT INTO idem_migrations (version, name, floor) VALUES ($1, 'next', $2)`, next, migrations.Latest())
	require.NoError(t, err)
	headC := start(t, "HEAD C", bins.head, args(true))
	require.Equal(t, next, headC.schema)
	require.Zero(t, served(headC, refs("head-on-next", 2)))
	_, err = schema.Pool.Exec(ctx, `UPDATE idem_migrations SET floor = $1 WHERE version = $1`, next)
	require.NoError(t, err)
	_, err = launch("HEAD on a contract", bins.head, args(true))
	require.ErrorContains(t, err, fmt.Sprintf("needs a binary that knows version %d or later; this binary knows up to %d", next, migrations.Latest()))
	_, err = schema.Pool.Exec(ctx, `DELETE FROM idem_migrations WHERE version = $1`, next)
	require.NoError(t, err)

	// A key this tree replaced after it expired (generation 1) and left in
	// flight: its fingerprint binds the generation (downstream scheme 3),
	// which v0.1.0 cannot compare, so a client retry there is answered 422
	// and sends nothing; v0.1.0's completer, which compares no fingerprint,
	// resumes it and sends the provider the downstream key this tree sent
	// (v0.1.0 knows no generation, but hashes that fingerprint the same
	// way), never the expired request's: the provider charges the new
	// request once, and this tree replays the answer.
	headD := start(t, "HEAD D", bins.head, append(args(true), "-retention", "1s"))
	reused := "reused-after-expiry"
	earlier := finish(t, headD.url, reused)
	waitCtx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	for expired := false; !expired; {
		require.NoError(t, schema.Pool.QueryRow(waitCtx, `SELECT expires_at <= now() FROM idem_keys WHERE key = $1`, reused).Scan(&expired))
		if !expired {
			select {
			case <-waitCtx.Done():
				require.FailNow(t, "the key did not expire")
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	strand(t, prov, headD, []string{reused})
	var generation int
	require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT generation FROM idem_keys WHERE key = $1`, reused).Scan(&generation))
	require.Equal(t, 1, generation)
	resp, body, err := post(ctx, prevB.url, reused)
	require.NoError(t, err)
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode, "v0.1.0 on a generation-1 key: %s", body)
	completedByPrevious := 0
	for completedByPrevious == 0 {
		// The killed process's lease runs out first; until then the
		// completer claims nothing.
		require.NoError(t, waitCtx.Err(), "v0.1.0's completer never completed the generation-1 key")
		out, err := exec.CommandContext(waitCtx, bins.previous, append(args(false), "-complete-once")...).CombinedOutput()
		require.NoError(t, err, "%s", out)
		var claimed int
		at := bytes.LastIndex(out, []byte("completed claimed="))
		require.GreaterOrEqual(t, at, 0, "%s", out)
		_, err = fmt.Sscanf(string(out[at:]), "completed claimed=%d completed=%d", &claimed, &completedByPrevious)
		require.NoError(t, err, "%s", out)
		if completedByPrevious == 0 {
			select {
			case <-waitCtx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	later := finish(t, headA.url, reused)
	require.True(t, later.replayed, "v0.1.0's completer finished it; this tree replays")
	chargeOf := func(body string) string {
		var out struct {
			Charge string `json:"charge"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &out))
		return out.Charge
	}
	require.Equal(t, 2, prov.chargesOf(reused), "the provider charged each request once")
	require.NotEqual(t, chargeOf(earlier.body), chargeOf(later.body), "the new request is answered with its own charge")
	genRefused := fmt.Sprintf("a generation-%d key (one that replaced an expired key) left in flight by HEAD after the charge: a client retry on v0.1.0 is answered 422 key-reused and sends nothing; v0.1.0's completer finishes it with the charge HEAD made (%s, not the earlier request's %s; %d charges for the key's two requests), HEAD replays it",
		generation, chargeOf(later.body), chargeOf(earlier.body), prov.chargesOf(reused))

	// Each key: one order, one charge, finished.
	orders, charges := 0, 0
	for ref := range all {
		var n int
		require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT count(*) FROM svc_orders WHERE ref = $1`, ref).Scan(&n))
		require.Equal(t, 1, n, "orders for %s", ref)
		c := prov.chargesOf(ref)
		require.Equal(t, 1, c, "charges for %s", ref)
		orders, charges = orders+n, charges+c
	}
	var unfinished int
	require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT count(*) FROM idem_keys WHERE status <> 'finished'`).Scan(&unfinished))
	require.Zero(t, unfinished)

	short := bins.commit[:7]
	say("upgrade matrix: previous = %s (%s, knows schema %d), HEAD (knows schema %d); one database, lease %s", previousTag, short, previousSchema, migrations.Latest(), lease)
	say("  %-22s | %-34s | %-34s | %s", "release \\ schema", fmt.Sprintf("schema %d", previousSchema), fmt.Sprintf("schema %d", migrations.Latest()),
		fmt.Sprintf("schema %d (simulated next release)", next))
	say("  %-22s | %-34s | %-34s | %s", "previous "+previousTag, "serves (migrated 0 -> 6 on start)",
		fmt.Sprintf("serves, %d requests, %d x 5xx (*)", len(afterMigration)+len(startedAfter), prevErrs), "not tried")
	say("  %-22s | %-34s | %-34s | %s", "HEAD", headOn6, fmt.Sprintf("serves (migrated %d -> %d on start)", previousSchema, migrations.Latest()),
		fmt.Sprintf("floor %d: starts, migrating on start; floor %d: refuses", migrations.Latest(), next))
	say("  (*) a process running across HEAD's migration, and one started after it without migrating; started migrating on start, v0.1.0 refuses the schema ahead")
	say("  keys handed over, previous -> HEAD: %d left in flight at \"charged\" (previous killed -9 after the provider charged), finished by HEAD: %d x 201 in %d tries (409 until the lease ran out)", len(fromPrevious), len(fromPrevious), tries)
	say("  keys handed over, HEAD -> previous: %d left in flight at \"charged\" (HEAD killed -9 after the provider charged), finished by the previous release: %d x 201 in %d tries (409 until the lease ran out)", len(fromHead), len(fromHead), backTries)
	say("  finished keys replayed across builds: %d of %d, identical bodies, in both directions", replays, replays)
	say("  %s", genRefused)
	say("  audit: %d keys, %d orders, %d charges (each key charged once: asserted above), %d unfinished", len(all), orders, charges, unfinished)
	t.Log("\n" + strings.Join(report, "\n"))
}
