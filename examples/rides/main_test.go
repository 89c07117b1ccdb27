package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/internal/pgtest"
)

// runMainEnv makes the test binary behave as the rides program, so the
// tests can run its commands as real processes, and the demo's
// os.Executable() (this binary) can start serve processes.
const runMainEnv = "RIDES_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	pgtest.Main(m)
}

// command returns this binary as the rides program with args. The
// environment is the test's, minus the variables the commands read, plus
// env.
func command(ctx context.Context, args []string, env ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "DATABASE_URL", "PAYMENTS_URL", "RIDES_ADDR", "RIDES_URL", "FAKEPAY_ADDR", runMainEnv:
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	cmd.Env = append(cmd.Env, runMainEnv+"=1")
	cmd.Env = append(cmd.Env, env...)
	// A test that fails half-way must not leave the process (and its
	// children, and its throwaway Postgres) behind.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// summaryLine is a "name: number" line of the summary.
var summaryLine = regexp.MustCompile(`(?m)^([a-z0-9 ()/]+): (-?[0-9]+(?:\.[0-9]+)?)$`)

func parseSummary(t *testing.T, out string) map[string]float64 {
	t.Helper()
	lines := map[string]float64{}
	for _, m := range summaryLine.FindAllStringSubmatch(out, -1) {
		v, err := strconv.ParseFloat(m[2], 64)
		require.NoError(t, err)
		lines[m[1]] = v
	}
	return lines
}

// The summary's wording is part of the interface: these lines, each
// "name: number".
var summaryNames = []string{
	"requests", "retries", "replays", "conflicts (409)", "succeeded (201)", "declined (402)",
	"charges in ledger", "double charges", "rides without charge", "charges without ride",
	"receipts missing", "stuck keys", "p50 latency ms", "p99 latency ms", "throughput req/s",
	"invariants violated",
}

var invariantNames = []string{
	"double charges", "rides without charge", "charges without ride", "receipts missing", "stuck keys",
	"replay mismatches", "unfinished requests", "unexpected answers", "answers disagreeing with database",
	"invariants violated",
}

func requireHealthySummary(t *testing.T, out string) map[string]float64 {
	t.Helper()
	summary := parseSummary(t, out)
	for _, name := range summaryNames {
		require.Contains(t, summary, name, "summary line %q missing from:\n%s", name, out)
	}
	for _, name := range invariantNames {
		require.Zero(t, summary[name], "invariant %q in:\n%s", name, out)
	}
	require.Positive(t, summary["requests"], "no request in:\n%s", out)
	require.Positive(t, summary["succeeded (201)"], "no ride in:\n%s", out)
	require.Equal(t, summary["succeeded (201)"], summary["charges in ledger"], "one charge per ride:\n%s", out)
	require.Equal(t, summary["succeeded (201)"]+summary["declined (402)"], summary["requests"], "every request finished:\n%s", out)
	return summary
}

// The demo, as a newcomer runs it, with nothing set up (no DATABASE_URL:
// it starts its own Postgres), with faults on and serve processes killed
// with SIGKILL along the way. It must exit 0 with every invariant at 0.
func TestDemoWithKills(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the whole demo (about 20s); skipped with -short")
	}
	out, summary := runDemoWithKills(t, "6s")
	require.Zero(t, summary["unexpected server exits"])
	require.Positive(t, summary["declined (402)"], "some requests come from the declined user:\n%s", out)
	t.Logf("demo summary:\n%s", out[strings.Index(out, "server kills:"):])
}

// runDemoWithKills runs the demo for duration with faults on and a serve
// process killed every 1.5s, env added to its environment, and returns its
// output and summary once it has exited 0 with every invariant at 0 and at
// least one kill.
func runDemoWithKills(t *testing.T, duration string, env ...string) (string, map[string]float64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	logDir := t.TempDir()
	logTailsOnFailure(t, logDir)
	cmd := command(ctx, []string{"demo", "--duration", duration, "--kill-every", "1500ms", "--clients", "6", "--log-dir", logDir}, env...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	out := stdout.String()
	require.NoError(t, err, "demo failed:\nstdout:\n%s\nstderr:\n%s", out, stderr.String())
	summary := requireHealthySummary(t, out)
	require.Positive(t, summary["server kills"], "the demo killed no server:\n%s", out)
	return out, summary
}

// logTailsOnFailure logs, if t fails, the end of each serve process's log in
// the demo's logDir: the directory is t's and goes away with it, and a serve
// that exits or misbehaves says why only there.
func logTailsOnFailure(t *testing.T, logDir string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		logs, _ := filepath.Glob(filepath.Join(logDir, "serve-*.log"))
		for _, path := range logs {
			content, err := os.ReadFile(path)
			if err != nil {
				t.Logf("%s: %v", path, err)
				continue
			}
			const tail = 8 << 10
			if len(content) > tail {
				content = content[len(content)-tail:]
			}
			t.Logf("end of %s:\n%s", filepath.Base(path), content)
		}
	})
}

// Ctrl-C stops the demo and everything it started: the serve processes and
// the throwaway Postgres.
func TestDemoStopsCleanlyOnInterrupt(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := command(ctx, []string{"demo", "--duration", "10m", "--log-dir", t.TempDir()})
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())

	var pids []int
	var postgres string
	var out strings.Builder
	lines := bufio.NewScanner(stdout)
	servePID := regexp.MustCompile(`serve \d+: \S+ \(pid (\d+)\)`)
	postgresAddr := regexp.MustCompile(`postgres: local server at (\S+), database (\S+)`)
	for lines.Scan() {
		line := lines.Text()
		out.WriteString(line + "\n")
		if m := servePID.FindStringSubmatch(line); m != nil {
			pid, _ := strconv.Atoi(m[1])
			pids = append(pids, pid)
		}
		if m := postgresAddr.FindStringSubmatch(line); m != nil {
			postgres = "postgres://postgres@" + m[1] + "/" + m[2] + "?sslmode=disable&connect_timeout=10"
		}
		if strings.Contains(line, "simulating") {
			break
		}
	}
	require.Len(t, pids, 2, "output so far:\n%s\nstderr:\n%s", out.String(), stderr.String())
	go func() { _, _ = io.Copy(io.Discard, stdout) }()

	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	err = cmd.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "stderr:\n%s", stderr.String())
	require.Equal(t, 130, exit.ExitCode(), "stderr:\n%s", stderr.String())
	require.Contains(t, stderr.String(), "interrupted")
	require.NotContains(t, stderr.String(), "remove the throwaway Postgres")

	for _, pid := range pids {
		// The demo waited for its children, so they are gone, not zombies.
		require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "serve pid %d still exists", pid)
	}
	if postgres != "" { // a local cluster: it must be gone
		// Its port may already serve another test's cluster, which would
		// not have the demo's database: connecting to that database must
		// fail either way.
		conn, err := pgx.Connect(ctx, postgres)
		if err == nil {
			_ = conn.Close(ctx)
		}
		require.Error(t, err, "the throwaway Postgres of %s still accepts connections", postgres)
	}
}

// The commands one by one, as the README's "by hand" section runs them:
// fakepay and serve as processes, then simulate against them, auditing a
// database of the test's own.
func TestCommandsByHand(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	// Cancelling kills the processes, so it comes after their SIGTERM
	// cleanups (cleanups run last-registered first).
	t.Cleanup(cancel)
	schema := pgtest.NewSchema(t)
	// Flags and their environment fallbacks: fakepay's address comes from
	// the flag, serve's from RIDES_ADDR. A lease long enough that a loaded
	// machine's heartbeat keeps up; the drain below outlasts it.
	fakepayAddr := startOnFreeAddr(t, ctx, "fakepay", func(addr string) *exec.Cmd {
		return command(ctx, []string{"fakepay", "--addr", addr, "--fail-rate", "0.1", "--drop-rate", "0.1", "--latency", "20ms"})
	}, "/v1/charges")
	ridesAddr := startOnFreeAddr(t, ctx, "serve", func(addr string) *exec.Cmd {
		return command(ctx, []string{"serve", "--lease", "10s"},
			"RIDES_ADDR="+addr, "DATABASE_URL="+schema.URL, "PAYMENTS_URL=http://"+fakepayAddr)
	}, "/healthz")

	var stdout, stderr bytes.Buffer
	sim := command(ctx, []string{"simulate", "--url", "http://" + ridesAddr, "--duration", "3s", "--clients", "4", "--drain", "90s"},
		"DATABASE_URL="+schema.URL, "PAYMENTS_URL=http://"+fakepayAddr)
	sim.Stdout, sim.Stderr = &stdout, &stderr
	require.NoError(t, sim.Run(), "simulate failed:\nstdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	requireHealthySummary(t, stdout.String())

	// serve created its tables (and River's) in the schema of its URL.
	var rides int
	require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT count(*) FROM rides`).Scan(&rides))
	require.Positive(t, rides)
	var jobs int
	require.NoError(t, schema.Pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE state = 'completed'`).Scan(&jobs))
	require.Positive(t, jobs)
}

// start runs a long-lived command and waits until ready answers 200; it is
// stopped with SIGTERM when the test ends and must then exit 0.
// startOnFreeAddr starts the command cmdFor makes for a free local address
// and waits until readyPath answers 200 there. The address is free when
// picked but may be taken before the command binds it (other tests run at
// the same time): a start that fails to bind is tried on another address.
func startOnFreeAddr(t *testing.T, ctx context.Context, name string, cmdFor func(addr string) *exec.Cmd, readyPath string) string {
	t.Helper()
	for try := 1; ; try++ {
		addr := freeAddr(t)
		if start(t, ctx, name, cmdFor(addr), "http://"+addr+readyPath) {
			return addr
		}
		require.Less(t, try, 5, "%s found its address taken %d times", name, try)
		t.Logf("%s: %s was taken before it bound it; trying another address", name, addr)
	}
}

// start runs cmd and waits until ready answers 200. It reports false when
// the command exited because its address was taken, and fails the test on
// any other exit.
func start(t *testing.T, ctx context.Context, name string, cmd *exec.Cmd, ready string) bool {
	t.Helper()
	var output lockedBuffer
	cmd.Stdout, cmd.Stderr = &output, &output
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Polling: the server is another process.
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case err := <-exited:
			if strings.Contains(output.String(), "address already in use") {
				return false
			}
			t.Fatalf("%s exited before it was ready (%v):\n%s", name, err, output.String())
		default:
		}
		resp, err := http.Get(ready)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v", name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s was not ready within a minute:\n%s", name, output.String())
		}
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			require.NoError(t, err, "%s did not exit cleanly on SIGTERM:\n%s", name, output.String())
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			t.Errorf("%s did not stop within a minute of SIGTERM:\n%s", name, output.String())
		}
	})
	return true
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Usage errors and help, in-process.
func TestUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args   []string
		status int
		output string
	}{
		{nil, 2, "Commands:"},
		{[]string{"help"}, 0, "Commands:"},
		{[]string{"nope"}, 2, `unknown command "nope"`},
		{[]string{"serve", "-h"}, 0, "-database-url"},
		{[]string{"demo", "--help"}, 0, "-kill-every"},
		{[]string{"fakepay", "--fail-rate", "lots"}, 2, "invalid value"},
		{[]string{"simulate", "extra"}, 2, "unexpected arguments"},
		{[]string{"simulate", "--database-url", ""}, 1, "database URL is required"},
		{[]string{"serve", "--database-url", "", "--payments-url", "http://x"}, 1, "database URL is required"},
		{[]string{"fakepay", "--addr", "127.0.0.1:0", "--drop-rate", "2"}, 1, "DropRate must be between 0 and 1"},
		{[]string{"serve", "--log-level", "loud", "--database-url", "postgres://x"}, 1, "log level"},
	} {
		var stdout, stderr bytes.Buffer
		status := run(tc.args, &stdout, &stderr)
		require.Equal(t, tc.status, status, "%v: stdout %q stderr %q", tc.args, stdout.String(), stderr.String())
		require.Contains(t, stdout.String()+stderr.String(), tc.output, "%v", tc.args)
	}
}

// A variable that is set but does not parse is an error, not a silent
// default.
func TestEnvironmentFallbackErrors(t *testing.T) {
	t.Setenv("RIDES_LEASE", "soon")
	var stdout, stderr bytes.Buffer
	require.Equal(t, 1, run([]string{"serve"}, &stdout, &stderr))
	require.Contains(t, stderr.String(), `RIDES_LEASE="soon"`)
}
