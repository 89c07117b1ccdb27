package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// BouncerEnv names a pgbouncer binary to use instead of the one found on PATH or in /usr/sbin.
const BouncerEnv = "IDEM_PGBOUNCER"

// ErrNoBouncer is wrapped by the error of StartBouncer when no pgbouncer binary is installed.
var ErrNoBouncer = errors.New("pgtest: pgbouncer is not installed")

// BouncerPoolSize is each database alias's server pool: small, so that a test's concurrency
// shares server connections between clients, as it does in production.
const BouncerPoolSize = 8

// identPattern is a plain lowercase identifier, which needs no quoting in pgbouncer.ini or SQL.
var identPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// Bouncer is a PgBouncer in transaction pooling mode in front of a server, with an alias (a
// database name of its own) per database and schema a test asks for. It runs from the local
// pgbouncer binary (Debian's pgbouncer package), on 127.0.0.1 on a free port, as the postgres
// system user when we are root, and needs the same password as the server behind it.
type Bouncer struct {
	bin     string
	workDir string
	account *runAs
	port    int
	logf    func(string, ...any)

	user, password string
	host           string // the server's host:port
	version        string

	mu      sync.Mutex
	aliases []string // lines of the [databases] section
	cmd     *exec.Cmd
	exited  <-chan struct{}
}

// bouncerDirs are where findBouncer looks after PATH: Debian's package installs to /usr/sbin,
// which is not on a normal user's PATH.
var bouncerDirs = []string{"/usr/sbin", "/usr/local/sbin", "/usr/local/bin", "/usr/bin"}

// findBouncer finds pgbouncer like the PostgreSQL binaries are found: BouncerEnv, PATH, then the
// sbin directories Debian's package installs to (not on a normal user's PATH).
func findBouncer() (string, error) {
	if path := strings.TrimSpace(os.Getenv(BouncerEnv)); path != "" {
		if _, err := os.Stat(path); err != nil {
			return "", fmt.Errorf("pgtest: %s=%s: %w", BouncerEnv, path, err)
		}
		return path, nil
	}
	if path, err := exec.LookPath("pgbouncer"); err == nil {
		return path, nil
	}
	for _, dir := range bouncerDirs {
		path := filepath.Join(dir, "pgbouncer")
		if info, err := os.Stat(path); err == nil && info.Mode().IsRegular() && info.Mode().Perm()&0o111 != 0 {
			return path, nil
		}
	}
	return "", fmt.Errorf("%w: no pgbouncer on PATH, in %s or in /usr/sbin; install it (apt-get install pgbouncer) or set %s",
		ErrNoBouncer, BouncerEnv, BouncerEnv)
}

// StartBouncer starts a pgbouncer in transaction pooling mode in front of the server adminURL
// points at (its host, port, user and password). Close stops it.
func StartBouncer(ctx context.Context, adminURL string, logf func(string, ...any)) (*Bouncer, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	bin, err := findBouncer()
	if err != nil {
		return nil, err
	}
	if !localSupported {
		return nil, fmt.Errorf("%w: pgbouncer needs a Unix system", ErrNoBouncer)
	}
	u, err := url.Parse(adminURL)
	if err != nil {
		return nil, fmt.Errorf("pgtest: bouncer: parse the server URL: %w", err)
	}
	account, err := lookupRunAs()
	if err != nil {
		return nil, err
	}
	tempDir := os.TempDir()
	if err := checkReachable(tempDir, account); err != nil {
		return nil, err
	}
	workDir, err := newWorkDir(tempDir, clusterDirPrefix+"bouncer-", account)
	if err != nil {
		return nil, err
	}
	b := &Bouncer{bin: bin, workDir: workDir, account: account, logf: logf, host: u.Host, user: u.User.Username()}
	b.password, _ = u.User.Password()
	if b.user == "" {
		b.user = "postgres"
	}
	if b.password == "" {
		// A server that trusts us ignores it; clients of the bouncer still need one.
		b.password = randomHex(16)
	}
	if out, err := exec.Command(bin, "--version").Output(); err == nil {
		b.version, _, _ = strings.Cut(strings.TrimSpace(string(out)), "\n")
	}
	began := time.Now()
	for attempt := 1; ; attempt++ {
		err = b.run(ctx)
		if err == nil {
			break
		}
		if !errors.Is(err, errPortTaken) || attempt >= portAttempts {
			_ = os.RemoveAll(workDir)
			return nil, err
		}
	}
	logf("pgtest: %s ready on 127.0.0.1:%d (pool_mode=transaction) in %s", b.version, b.port, time.Since(began).Round(time.Millisecond))
	return b, nil
}

// Version is what pgbouncer --version printed first, such as "PgBouncer 1.18.0".
func (b *Bouncer) Version() string { return b.version }

// Port is the port the bouncer listens on, on 127.0.0.1.
func (b *Bouncer) Port() int { return b.port }

// writeConfig writes pgbouncer.ini and the auth file.
func (b *Bouncer) writeConfig() error {
	host, port, ok := strings.Cut(b.host, ":")
	if !ok {
		port = "5432"
	}
	var ini strings.Builder
	ini.WriteString("[databases]\n")
	for _, alias := range b.aliases {
		ini.WriteString(alias + "\n")
	}
	// A wildcard, for the admin console's sake and for plain databases.
	fmt.Fprintf(&ini, "* = host=%s port=%s\n", host, port)
	fmt.Fprintf(&ini, `
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = scram-sha-256
auth_file = %s
admin_users = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 1000
server_lifetime = 3600
server_idle_timeout = 60
ignore_startup_parameters = extra_float_digits
logfile = %s
pidfile = %s
`, b.port, filepath.Join(b.workDir, "userlist.txt"), b.user, BouncerPoolSize,
		filepath.Join(b.workDir, "pgbouncer.log"), filepath.Join(b.workDir, "pgbouncer.pid"))
	files := map[string]string{
		"pgbouncer.ini": ini.String(),
		"userlist.txt":  fmt.Sprintf("%q %q\n", b.user, b.password),
	}
	for name, content := range files {
		path := filepath.Join(b.workDir, name)
		if err := os.WriteFile(path+".new", []byte(content), 0o600); err != nil {
			return fmt.Errorf("pgtest: bouncer: write %s: %w", name, err)
		}
		if b.account != nil {
			if err := os.Chown(path+".new", b.account.uid, b.account.gid); err != nil {
				return fmt.Errorf("pgtest: bouncer: hand %s to user %s: %w", name, b.account.name, err)
			}
		}
		if err := os.Rename(path+".new", path); err != nil {
			return fmt.Errorf("pgtest: bouncer: write %s: %w", name, err)
		}
	}
	return nil
}

func (b *Bouncer) run(ctx context.Context) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	b.port = port
	if err := b.writeConfig(); err != nil {
		return err
	}
	cmd := exec.Command(b.bin, filepath.Join(b.workDir, "pgbouncer.ini"))
	cmd.Dir = b.workDir
	cmd.Env = childEnv()
	configureChild(cmd, b.account)
	exited, err := startPinned(cmd)
	if err != nil {
		return fmt.Errorf("pgtest: start %s: %w", b.bin, err)
	}
	b.cmd, b.exited = cmd, exited
	if err := waitReady(ctx, b.adminConsoleURL(), exited); err != nil {
		_ = b.shutdown()
		log := tailFile(filepath.Join(b.workDir, "pgbouncer.log"), 30)
		if strings.Contains(log, "Address already in use") {
			return fmt.Errorf("%w: %d", errPortTaken, port)
		}
		return fmt.Errorf("pgtest: pgbouncer did not become ready: %w\n--- end of its log ---\n%s", err, log)
	}
	return nil
}

// adminConsoleURL reaches pgbouncer's admin console, which speaks the simple protocol only.
func (b *Bouncer) adminConsoleURL() string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(b.user, b.password), Host: "127.0.0.1:" + strconv.Itoa(b.port),
		Path: "/pgbouncer", RawQuery: "sslmode=disable&default_query_exec_mode=simple_protocol"}
	return u.String()
}

// Admin runs a command on the admin console (SHOW POOLS, RELOAD, ...) and returns its rows as text.
func (b *Bouncer) Admin(ctx context.Context, command string) ([][]string, error) {
	conn, err := pgx.Connect(ctx, b.adminConsoleURL())
	if err != nil {
		return nil, fmt.Errorf("pgtest: bouncer admin console: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, command)
	if err != nil {
		return nil, fmt.Errorf("pgtest: bouncer: %s: %w", command, err)
	}
	defer rows.Close()
	var out [][]string
	for rows.Next() {
		values := rows.RawValues()
		row := make([]string, len(values))
		for i, v := range values {
			row[i] = string(v)
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgtest: bouncer: %s: %w", command, err)
	}
	return out, nil
}

// AddAlias makes alias a database of the bouncer's, on database dbname of the server, whose
// server connections start with search_path set to searchPath when it is not empty (pgbouncer
// passes no search_path from its clients), and returns a URL to it through the bouncer.
func (b *Bouncer) AddAlias(ctx context.Context, alias, dbname, searchPath string) (string, error) {
	if !identPattern.MatchString(alias) || !identPattern.MatchString(dbname) {
		return "", fmt.Errorf("%w: bouncer alias %q of database %q", ErrInvalidName, alias, dbname)
	}
	host, port, ok := strings.Cut(b.host, ":")
	if !ok {
		port = "5432"
	}
	line := fmt.Sprintf("%s = host=%s port=%s dbname=%s", alias, host, port, dbname)
	if searchPath != "" {
		if !identPattern.MatchString(searchPath) {
			return "", fmt.Errorf("%w: search_path %q", ErrInvalidName, searchPath)
		}
		line += fmt.Sprintf(" connect_query='SET search_path TO %s'", searchPath)
	}
	b.mu.Lock()
	b.aliases = append(b.aliases, line)
	err := b.writeConfig()
	b.mu.Unlock()
	if err != nil {
		return "", err
	}
	if _, err := b.Admin(ctx, "RELOAD"); err != nil {
		return "", err
	}
	return b.URL(alias), nil
}

// URL is a URL to database name through the bouncer.
func (b *Bouncer) URL(name string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(b.user, b.password), Host: "127.0.0.1:" + strconv.Itoa(b.port),
		Path: "/" + name, RawQuery: "sslmode=disable"}
	return u.String()
}

// Kill ends the bouncer at once, as a crash would.
func (b *Bouncer) Kill() error { return b.cmd.Process.Kill() }

// Alive reports whether the bouncer process is still running.
func (b *Bouncer) Alive() bool {
	select {
	case <-b.exited:
		return false
	default:
		return true
	}
}

// Log is the end of the bouncer's log, after how it exited when it has: a FATAL line ends the
// log of a pgbouncer that gave up, a signal leaves none.
func (b *Bouncer) Log() string {
	log := tailFile(filepath.Join(b.workDir, "pgbouncer.log"), 40)
	if b.Alive() {
		return log
	}
	return fmt.Sprintf("pgbouncer (pid %d) exited: %s\n%s", b.cmd.Process.Pid, b.cmd.ProcessState, log)
}

func (b *Bouncer) shutdown() error {
	if b.cmd == nil {
		return nil
	}
	// SIGTERM is an immediate shutdown; SIGINT would wait for clients to leave.
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	return awaitStop(b.cmd, b.exited, "pgbouncer", "SIGTERM")
}

// Close stops the bouncer and removes its directory.
func (b *Bouncer) Close() error {
	err := b.shutdown()
	if rmErr := os.RemoveAll(b.workDir); rmErr != nil {
		err = errors.Join(err, fmt.Errorf("pgtest: remove %s: %w", b.workDir, rmErr))
	}
	return err
}
