package pgtest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// orphanParentEnv, set to a temp dir, turns the test binary into runOrphanParent.
const orphanParentEnv = "IDEM_PGTEST_ORPHAN_PARENT"

// localTempDir returns an empty directory for clusters and templates, so a test sees a cold start
// whatever the machine's cache holds. It skips the test on a machine without the binaries.
func localTempDir(t *testing.T) string {
	t.Helper()
	requireLocalBinaries(t)
	// Not t.TempDir: when we are root, postgres runs as the postgres user and must be able to enter
	// the directory, and t.TempDir's parent is private.
	dir, err := os.MkdirTemp("", "idem-pgbase-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o755))
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func requireLocalBinaries(t *testing.T) {
	t.Helper()
	if _, err := findBinDir(); err != nil {
		t.Skipf("no local PostgreSQL binaries, so no local cluster to test: %v", err)
	}
}

// requireTestSettings checks the server runs with the speed-over-durability settings.
func requireTestSettings(t *testing.T, adminURL string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, adminURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for setting, want := range map[string]string{
		"fsync":              "off",
		"synchronous_commit": "off",
		"full_page_writes":   "off",
		"max_connections":    "300",
		"shared_buffers":     "128MB",
		"listen_addresses":   "127.0.0.1",
	} {
		var got string
		require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting($1)", setting).Scan(&got))
		require.Equal(t, want, got, setting)
	}
}

func TestLocalClusterSettingsOverrideDefaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	requireLocalBinaries(t)
	server, err := Start(ctx, &Options{
		Mode:     ModeLocal, // the usual temp dir: this test is about settings, not the template
		Settings: []string{"shared_buffers=256MB", "work_mem=8MB"},
	})
	require.NoError(t, err)
	defer server.Close()
	conn, err := pgx.Connect(ctx, server.AdminURL())
	require.NoError(t, err)
	defer conn.Close(ctx)
	for setting, want := range map[string]string{
		"shared_buffers": "256MB", // overrides the default 128MB
		"work_mem":       "8MB",
		"fsync":          "off", // the other defaults stay
	} {
		var got string
		require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting($1)", setting).Scan(&got))
		require.Equal(t, want, got, setting)
	}
}

// TestLocalClusterTemplate: on a cold machine (CI), the test binaries of `go test ./...` race to
// build the cached template; every later start copies it; Close leaves nothing running or on disk
// but the template.
func TestLocalClusterTemplate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	opts := &Options{Mode: ModeLocal, TempDir: localTempDir(t), Logf: t.Logf}

	// Two starts racing on an empty cache both build a template; one rename wins and both
	// clusters come from the same cached directory.
	servers := make([]*Server, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range servers {
		wg.Go(func() { servers[i], errs[i] = Start(context.Background(), opts) })
	}
	wg.Wait()
	for _, server := range servers {
		if server != nil {
			defer server.Close()
		}
	}
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.Equal(t, servers[0].local.env.templateDir, servers[1].local.env.templateDir)
	require.NotEqual(t, servers[0].local.port, servers[1].local.port)
	for _, server := range servers {
		conn, err := pgx.Connect(context.Background(), server.AdminURL())
		require.NoError(t, err)
		require.NoError(t, conn.Close(context.Background()))
	}

	entries, err := os.ReadDir(opts.TempDir)
	require.NoError(t, err)
	var templates []string
	for _, entry := range entries {
		if strings.HasPrefix(entry.Name(), templateDirPrefix) {
			templates = append(templates, entry.Name())
		}
	}
	require.Len(t, templates, 1, "template build directories are removed, the loser's included")
	require.True(t, servers[0].local.env.templateCreated || servers[1].local.env.templateCreated, "a start in an empty temp dir runs initdb")
	requireTestSettings(t, servers[0].AdminURL())

	dbURL, err := servers[0].CreateDatabase(ctx, "cold")
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
	workDir, pid := servers[0].local.workDir, servers[0].local.cmd.Process.Pid
	require.NoError(t, servers[0].Close())
	require.NoDirExists(t, workDir)
	require.False(t, processAlive(pid), "postmaster %d outlived Close", pid)
	require.NoError(t, servers[0].Close(), "Close is idempotent")
	_, err = servers[0].CreateDatabase(ctx, "late")
	require.ErrorIs(t, err, ErrClosed)

	warm, err := Start(ctx, opts)
	require.NoError(t, err)
	defer warm.Close()
	require.False(t, warm.local.env.templateCreated, "a later start copies the cached template")
	require.Equal(t, servers[0].local.env.templateDir, warm.local.env.templateDir)
	requireTestSettings(t, warm.AdminURL())
	require.NoError(t, warm.Close())
	require.NoDirExists(t, warm.local.workDir)
	require.DirExists(t, warm.local.env.templateDir, "the template outlives the clusters made from it")
}

// TestLocalClusterDiesWithItsParent kills, with SIGKILL, a process that started a local cluster,
// and expects the postmaster to follow it.
func TestLocalClusterDiesWithItsParent(t *testing.T) {
	t.Parallel()
	requireLocalBinaries(t)
	tempDir := os.TempDir() // warm: this test is about the server, not the template

	parent := exec.Command(os.Args[0], "-test.run=^$")
	parent.Env = append(os.Environ(), orphanParentEnv+"="+tempDir)
	stdin, err := parent.StdinPipe()
	require.NoError(t, err)
	defer stdin.Close()
	stdout, err := parent.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	parent.Stderr = &stderr
	require.NoError(t, parent.Start())
	waited := false
	defer func() {
		if !waited {
			_ = parent.Process.Kill()
			_ = parent.Wait()
		}
	}()

	type report struct {
		workDir string
		pid     int
		err     error
	}
	reports := make(chan report, 1)
	go func() {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil {
			reports <- report{err: fmt.Errorf("read parent's report: %w", err)}
			return
		}
		workDir, pid, _ := strings.Cut(strings.TrimSpace(line), " ")
		n, err := strconv.Atoi(pid)
		reports <- report{workDir: workDir, pid: n, err: err}
	}()
	var started report
	select {
	case started = <-reports:
	case <-time.After(2 * time.Minute):
		t.Fatal("the parent process did not report a started cluster in time")
	}
	require.NoError(t, started.err, "parent's stderr: %s", &stderr)
	require.True(t, processAlive(started.pid))
	require.DirExists(t, filepath.Join(started.workDir, "data"))

	require.NoError(t, parent.Process.Kill())
	_ = parent.Wait()
	waited = true

	requireEventually(t, 30*time.Second, func() bool { return !processAlive(started.pid) },
		"postmaster %d outlived its killed parent", started.pid)

	// What the killed parent left on disk is the next start's to clean up.
	removeAbandonedDirs(tempDir, t.Logf)
	require.NoDirExists(t, started.workDir)
}

// runOrphanParent starts a local cluster, reports "<workDir> <postmaster pid>", and waits to be
// killed.
func runOrphanParent(tempDir string) {
	server, err := Start(context.Background(), &Options{Mode: ModeLocal, TempDir: tempDir})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Printf("%s %d\n", server.local.workDir, server.local.cmd.Process.Pid)
	_, _ = io.Copy(io.Discard, os.Stdin) // returns only if the test gives up on us without killing
	_ = server.Close()
	os.Exit(0)
}

// requireEventually polls an external process's state until cond holds or the deadline passes.
func requireEventually(t *testing.T, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf(format, args...)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRemoveAbandonedDirs(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	dead := strconv.Itoa(deadPID(t))
	self := strconv.Itoa(os.Getpid())

	makeDir := func(name, owner, postmaster string, age time.Duration) string {
		dir := filepath.Join(base, name)
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "data"), 0o700))
		if owner != "" {
			require.NoError(t, os.WriteFile(filepath.Join(dir, ownerFileName), []byte(owner+"\n"), 0o644))
		}
		if postmaster != "" {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "data", "postmaster.pid"), []byte(postmaster+"\n/data\n"), 0o600))
		}
		if age > 0 {
			then := time.Now().Add(-age)
			require.NoError(t, os.Chtimes(dir, then, then))
		}
		return dir
	}
	deadOwner := makeDir("idem-pgtest-dead", dead, "", 0)
	deadBoth := makeDir("idem-pgtest-deadboth", dead, dead, 0)
	liveOwner := makeDir("idem-pgtest-live", self, "", 0)
	livePostmaster := makeDir("idem-pgtest-livepm", dead, self, 0)
	newborn := makeDir("idem-pgtest-newborn", "", "", 0)
	ownerless := makeDir("idem-pgtest-ownerless", "", "", time.Hour)
	unrelated := makeDir("someone-else", dead, "", time.Hour)

	removeAbandonedDirs(base, t.Logf)

	require.NoDirExists(t, deadOwner)
	require.NoDirExists(t, deadBoth)
	require.NoDirExists(t, ownerless)
	require.DirExists(t, liveOwner)
	require.DirExists(t, livePostmaster, "a live postmaster is never pulled out from under")
	require.DirExists(t, newborn, "a directory may be about to get its owner file")
	require.DirExists(t, unrelated)
}

func TestHighestVersionDir(t *testing.T) {
	t.Parallel()
	require.Equal(t, "/usr/lib/postgresql/16/bin", highestVersionDir([]string{
		"/usr/lib/postgresql/9.6/bin",
		"/usr/lib/postgresql/16/bin",
		"/usr/lib/postgresql/10/bin",
		"/usr/lib/postgresql/beta/bin",
	}))
	require.Empty(t, highestVersionDir(nil))
}

func TestLastLines(t *testing.T) {
	t.Parallel()
	require.Equal(t, "c\nd", lastLines("a\nb\nc\nd\n", 2))
	require.Equal(t, "a", lastLines("a", 5))
}

func TestProcessAlive(t *testing.T) {
	t.Parallel()
	require.True(t, processAlive(os.Getpid()))
	require.False(t, processAlive(deadPID(t)))
	require.False(t, processAlive(0))
}

// TestLocalClusterRequiresPassword: a throwaway cluster lets in only those who have its URL, not
// every account on the machine, and no two clusters share a password, though they share a template.
func TestLocalClusterRequiresPassword(t *testing.T) {
	t.Parallel()
	requireLocalBinaries(t)
	ctx := context.Background()
	opts := &Options{Mode: ModeLocal} // the usual temp dir: this test is about the clusters, not the template
	servers := make([]*Server, 2)
	for i := range servers {
		server, err := Start(ctx, opts)
		require.NoError(t, err)
		defer server.Close()
		servers[i] = server
	}
	a, b := servers[0], servers[1]
	passwordA, passwordB := urlPassword(t, a.AdminURL()), urlPassword(t, b.AdminURL())
	require.Regexp(t, `^[0-9a-f]{32}$`, passwordA)
	require.NotEqual(t, passwordA, passwordB, "every cluster has a password of its own")

	// With the password, over TCP: the URLs pgtest hands out carry it.
	dbURL, err := a.CreateDatabase(ctx, "auth")
	require.NoError(t, err)
	require.Equal(t, passwordA, urlPassword(t, dbURL))
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	var method string
	require.NoError(t, conn.QueryRow(ctx,
		"SELECT string_agg(DISTINCT auth_method, ',') FROM pg_hba_file_rules WHERE error IS NULL").Scan(&method))
	require.Equal(t, "scram-sha-256", method, "pg_hba.conf trusts no one")
	var socketDirs string
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting('unix_socket_directories')").Scan(&socketDirs))
	require.NoError(t, conn.Close(ctx))

	// Without it, or with another cluster's, over TCP: refused.
	requireAuthFails(t, a.AdminURL(), "")
	requireAuthFails(t, a.AdminURL(), passwordB)

	// The Unix socket lives in a directory only the cluster's OS user may enter, and even there,
	// needs the password.
	socketDir := a.local.socketDir
	require.NotEmpty(t, socketDir)
	require.Equal(t, socketDir, socketDirs)
	info, err := os.Stat(socketDir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), info.Mode().Perm())
	wantUID := os.Geteuid()
	if account := a.local.env.account; account != nil {
		wantUID = account.uid
	}
	uid, _, ok := fileOwner(info)
	require.True(t, ok)
	require.Equal(t, wantUID, uid, "the socket directory belongs to the user postgres runs as")
	socketURL := fmt.Sprintf("postgres://postgres@/postgres?host=%s&port=%d&sslmode=disable", url.QueryEscape(socketDir), a.local.port)
	requireAuthFails(t, socketURL, "")
	socketConn, err := pgx.ConnectConfig(ctx, withPassword(t, socketURL, passwordA))
	require.NoError(t, err, "the socket works with the password")
	require.NoError(t, socketConn.Close(ctx))
}

// urlPassword returns the password in a URL, failing the test when there is none.
func urlPassword(t *testing.T, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	password, ok := u.User.Password()
	require.True(t, ok, "%s has no password", u.Redacted())
	return password
}

// withPassword parses rawURL with exactly this password, whatever the URL, PGPASSWORD or a
// ~/.pgpass say.
func withPassword(t *testing.T, rawURL, password string) *pgx.ConnConfig {
	t.Helper()
	config, err := pgx.ParseConfig(rawURL)
	require.NoError(t, err)
	config.Password = password
	config.Fallbacks = nil
	return config
}

// requireAuthFails checks that the server refuses to authenticate with this password ("" for none).
func requireAuthFails(t *testing.T, rawURL, password string) {
	t.Helper()
	conn, err := pgx.ConnectConfig(context.Background(), withPassword(t, rawURL, password))
	if err == nil {
		_ = conn.Close(context.Background())
	}
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "connecting with password %q must fail at authentication", password)
	require.Equal(t, "28P01", pgErr.Code, "invalid_password: %v", err)
}
