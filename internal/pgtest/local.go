package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	// clusterDirPrefix names every directory a local start makes under the temp dir, the template
	// builds included, so that one sweep finds everything a killed run left behind.
	clusterDirPrefix = "idem-pgtest-"
	// templateDirPrefix names the cached initdb output. It deliberately does not match
	// clusterDirPrefix: templates outlive the runs that made them.
	templateDirPrefix = "idem-pgtemplate-"
	// templateFormat changes whenever the initdb arguments do, so old templates are not reused.
	// v3: password authentication instead of trust.
	templateFormat = "v3"
	// ownerFileName holds the pid of the process that made a directory.
	ownerFileName = "idem-pgtest.owner"

	// abandonedDirAge is how old a directory without an owner file must be to count as abandoned:
	// a directory exists for a moment before its owner file is written.
	abandonedDirAge = 10 * time.Minute

	readyTimeout = time.Minute
	portAttempts = 5
	stopTimeout  = 15 * time.Second
)

// serverSettings trade durability, which a throwaway cluster does not need, for speed, and leave
// room for many parallel tests.
var serverSettings = []string{
	"fsync=off",
	"synchronous_commit=off",
	"full_page_writes=off",
	"max_connections=300",
	"shared_buffers=128MB",
}

// errPortTaken means another process bound our port between our probe and postgres's bind.
var errPortTaken = errors.New("pgtest: port already in use")

// runAs is the account initdb and postgres run as when we are root, which PostgreSQL refuses.
type runAs struct {
	name     string
	uid, gid int
}

// localEnv is what every cluster of a local start needs: the binaries, the account to run them
// as, and the cached template.
type localEnv struct {
	cfg             *config
	binDir          string
	account         *runAs // nil: ourselves
	version         string
	templateDir     string
	templateCreated bool // this start ran initdb, rather than finding a cached template
}

// localCluster is a postgres process we started, and the directory it lives in.
type localCluster struct {
	env       *localEnv
	workDir   string // idem-pgtest-*: owner file, server.log, socket/, data/
	dataDir   string
	socketDir string // private to the cluster's OS user; empty when its path would be too long
	port      int
	password  string   // of the postgres role, this cluster's own unless set before fromTemplate
	settings  []string // passed to postgres as -c name=value
	extraEnv  []string // added to postgres's environment (a Citus node's PGPASSFILE)
	copied    bool     // the data directory is a copy of the cached template

	// Set while postgres runs.
	cmd    *exec.Cmd
	exited <-chan struct{}
}

// prepareLocal finds the binaries and the account to run them as, clears away what killed runs
// left behind, and makes sure there is a template.
func prepareLocal(ctx context.Context, cfg *config) (*localEnv, error) {
	if !localSupported {
		return nil, unavailable(KindLocal, "throwaway clusters need a Unix system")
	}
	binDir, err := findBinDir()
	if err != nil {
		return nil, err
	}
	account, err := lookupRunAs()
	if err != nil {
		return nil, err
	}
	if err := checkReachable(cfg.tempDir, account); err != nil {
		return nil, err
	}
	removeAbandonedDirs(cfg.tempDir, cfg.logf)

	version, err := postgresVersion(binDir)
	if err != nil {
		return nil, err
	}
	templateDir, templateCreated, err := ensureTemplate(ctx, cfg.tempDir, binDir, version, account)
	if err != nil {
		return nil, err
	}
	return &localEnv{
		cfg:             cfg,
		binDir:          binDir,
		account:         account,
		version:         version,
		templateDir:     templateDir,
		templateCreated: templateCreated,
	}, nil
}

func startLocal(ctx context.Context, cfg *config) (*Server, error) {
	began := time.Now()
	env, err := prepareLocal(ctx, cfg)
	if err != nil {
		return nil, err
	}
	cluster, err := env.newCluster(cfg.settings)
	if err != nil {
		return nil, err
	}
	if err := cluster.fromTemplate(ctx); err != nil {
		_ = os.RemoveAll(cluster.workDir)
		return nil, err
	}
	if err := cluster.start(ctx); err != nil {
		_ = os.RemoveAll(cluster.workDir)
		return nil, err
	}

	server, err := newServer(KindLocal, cluster.adminURL(), cfg.logf)
	if err != nil {
		_ = cluster.stop()
		return nil, err
	}
	server.local = cluster
	server.stop = cluster.stop
	how := "copied the cached template"
	if env.templateCreated {
		how = "ran initdb and cached a template"
	}
	cfg.logf("pgtest: local PostgreSQL %s ready on 127.0.0.1:%d in %s (%s) in %s",
		env.version, cluster.port, time.Since(began).Round(time.Millisecond), how, cluster.workDir)
	return server, nil
}

// newCluster makes the work directory of a cluster, and its socket directory, but not its data
// directory.
func (e *localEnv) newCluster(settings []string) (*localCluster, error) {
	workDir, err := newWorkDir(e.cfg.tempDir, clusterDirPrefix, e.account)
	if err != nil {
		return nil, err
	}
	c := &localCluster{
		env:      e,
		workDir:  workDir,
		dataDir:  filepath.Join(workDir, "data"),
		settings: settings,
	}
	// A Unix socket path is limited to about 100 bytes; with a long TMPDIR we go without one, TCP
	// being all we use.
	socketDir := filepath.Join(workDir, "socket")
	if len(socketDir)+len("/.s.PGSQL.65535") <= 100 {
		if err := makePrivateDir(socketDir, e.account); err != nil {
			_ = os.RemoveAll(workDir)
			return nil, err
		}
		c.socketDir = socketDir
	}
	return c, nil
}

// makePrivateDir makes a directory only account (or we, when it is nil) may enter.
func makePrivateDir(dir string, account *runAs) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("pgtest: make %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil { // whatever the umask
		return fmt.Errorf("pgtest: make %s private: %w", dir, err)
	}
	if account != nil {
		if err := os.Chown(dir, account.uid, account.gid); err != nil {
			return fmt.Errorf("pgtest: hand %s to user %s: %w", dir, account.name, err)
		}
	}
	return nil
}

// fromTemplate makes the data directory a copy of the cached template, with a password of its own.
func (c *localCluster) fromTemplate(ctx context.Context) error {
	if err := copyTree(c.env.templateDir, c.dataDir, c.env.account); err != nil {
		return fmt.Errorf("pgtest: copy template %s: %w", c.env.templateDir, err)
	}
	c.copied = true
	if err := c.setPassword(ctx); err != nil {
		return c.withTemplateHint(err)
	}
	return nil
}

// setPassword gives the postgres role a new random password (or c.password, when the caller chose
// one, as a Citus cluster does for all its nodes), in single-user mode, before the server first
// listens: every connection needs a password (see ensureTemplate), and the template's is known to
// nobody, so until this runs nobody can connect at all. The password goes to postgres on its
// standard input, never on a command line, where any local user could read it.
func (c *localCluster) setPassword(ctx context.Context) error {
	password := c.password
	if password == "" {
		password = randomHex(16)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(c.env.binDir, "postgres"), "--single",
		"-D", c.dataDir, "-F", "-c", "password_encryption=scram-sha-256", "postgres")
	cmd.Stdin = strings.NewReader("ALTER ROLE postgres PASSWORD " + quoteLiteral(password) + "\n")
	var output bytes.Buffer
	cmd.Stdout = &output
	cmd.Stderr = &output
	cmd.Dir = c.workDir
	cmd.Env = childEnv()
	configureChild(cmd, c.env.account)
	err := runPinned(cmd)
	// Single-user mode reports a failed statement and carries on to a successful exit.
	out := strings.ReplaceAll(output.String(), password, "********")
	if err == nil && (strings.Contains(out, "ERROR:") || strings.Contains(out, "FATAL:") || strings.Contains(out, "PANIC:")) {
		err = errors.New("the statement failed")
	}
	if err != nil {
		return fmt.Errorf("pgtest: set the cluster's password in single-user mode: %w\n%s", err, lastLines(out, 30))
	}
	c.password = password
	return nil
}

// withTemplateHint adds, to an error starting a cluster copied from a template that an earlier
// start cached, how to force a fresh one.
func (c *localCluster) withTemplateHint(err error) error {
	if !c.copied || c.env.templateCreated {
		return err
	}
	return fmt.Errorf("%w\n(the cluster was copied from the cached template %s; delete it to force a fresh initdb)", err, c.env.templateDir)
}

// start runs postgres on a free port, trying another when some other process takes ours first,
// and waits until it accepts connections.
func (c *localCluster) start(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		err := c.run(ctx)
		if err == nil {
			return nil
		}
		if errors.Is(err, errPortTaken) && attempt < portAttempts {
			continue
		}
		return c.withTemplateHint(err)
	}
}

func (c *localCluster) adminURL() string {
	return c.url("127.0.0.1:" + strconv.Itoa(c.port))
}

// url is a superuser URL to the postgres database on host, which is one host:port or several
// separated by commas.
func (c *localCluster) url(host string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword("postgres", c.password),
		Host:     host,
		Path:     "/postgres",
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// run starts postgres on a free port and waits until it accepts connections.
func (c *localCluster) run(ctx context.Context) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	return c.runOn(ctx, port)
}

// runOn starts postgres on port, which a restarted server keeps, and waits until it accepts
// connections.
func (c *localCluster) runOn(ctx context.Context, port int) error {
	c.port = port

	logPath := filepath.Join(c.workDir, "server.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("pgtest: server log: %w", err)
	}
	defer logFile.Close() // postgres has its own descriptor once started

	// The socket directory is the socket's protection; the mode on the socket itself says the
	// same, in case it is ever elsewhere.
	args := []string{"-D", c.dataDir, "-p", strconv.Itoa(port), "-h", "127.0.0.1",
		"-k", c.socketDir, "-c", "unix_socket_permissions=0700"}
	for _, setting := range c.settings {
		args = append(args, "-c", setting)
	}
	// Not pg_ctl: postgres must be our own child for the parent-death signal to reach it.
	cmd := exec.Command(filepath.Join(c.env.binDir, "postgres"), args...)
	cmd.Dir = c.workDir // postgres run as another user must be able to read its working directory
	cmd.Env = append(childEnv(), c.extraEnv...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	configureChild(cmd, c.env.account)
	exited, err := startPinned(cmd)
	if err != nil {
		return fmt.Errorf("pgtest: start %s: %w", cmd.Path, err)
	}
	c.cmd, c.exited = cmd, exited

	if err := waitReady(ctx, c.adminURL(), exited); err != nil {
		_ = c.shutdown()
		serverLog := tailFile(logPath, 30)
		if strings.Contains(serverLog, "could not bind") || strings.Contains(serverLog, "Address already in use") {
			return fmt.Errorf("%w: %d", errPortTaken, port)
		}
		return fmt.Errorf("pgtest: local PostgreSQL did not become ready: %w\n--- end of %s ---\n%s", err, logPath, serverLog)
	}
	return nil
}

// stop shuts the server down and removes everything it had on disk.
func (c *localCluster) stop() error {
	err := c.shutdown()
	if rmErr := os.RemoveAll(c.workDir); rmErr != nil {
		err = errors.Join(err, fmt.Errorf("pgtest: remove %s: %w", c.workDir, rmErr))
	}
	return err
}

// shutdown asks for an immediate shutdown: the data is about to be thrown away, so there is nothing
// to checkpoint.
func (c *localCluster) shutdown() error {
	if c.cmd == nil {
		return nil
	}
	_ = quitProcess(c.cmd.Process)
	return awaitStop(c.cmd, c.exited, "postgres", "SIGQUIT")
}

// awaitStop waits, after signal was sent to it, for a child started by startPinned to exit, and
// kills it when it has not within stopTimeout.
func awaitStop(cmd *exec.Cmd, exited <-chan struct{}, name, signal string) error {
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-exited:
		return nil
	case <-timer.C:
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("pgtest: %s (pid %d) ignored %s for %s and was killed", name, cmd.Process.Pid, signal, stopTimeout)
	}
}

// startPinned starts cmd from a goroutine locked to its OS thread for the child's whole life. The
// parent-death signal fires when the thread that forked the child exits, not the process, and the
// Go runtime may retire threads: pinning keeps the signal meaning "the test binary died". The
// returned channel is closed when the child has exited and been reaped.
func startPinned(cmd *exec.Cmd) (<-chan struct{}, error) {
	started := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(exited)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return exited, nil
}

// runPinned is startPinned for a command we only wait for.
func runPinned(cmd *exec.Cmd) error {
	exited, err := startPinned(cmd)
	if err != nil {
		return err
	}
	<-exited
	if !cmd.ProcessState.Success() {
		return fmt.Errorf("%s: %s", filepath.Base(cmd.Path), cmd.ProcessState)
	}
	return nil
}

// waitReady polls until the server accepts a connection, it exits, or the deadline passes.
func waitReady(ctx context.Context, adminURL string, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	const pollInterval = 20 * time.Millisecond
	for {
		attemptCtx, attemptCancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(attemptCtx, adminURL)
		attemptCancel()
		if err == nil {
			return conn.Close(ctx)
		}
		timer := time.NewTimer(pollInterval)
		select {
		case <-exited:
			timer.Stop()
			return errors.New("postgres exited during start-up")
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("no connection within %s (last error: %v): %w", readyTimeout, err, ctx.Err())
		case <-timer.C:
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: find a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	return port, l.Close()
}

// ensureTemplate returns a cached, freshly initdb'd data directory for this PostgreSQL version,
// making it first if needed. It is built in a directory of its own and renamed into place, so
// concurrent test processes either see a complete template or none; if two build at once, one
// rename wins and the other's work is discarded.
func ensureTemplate(ctx context.Context, baseDir, binDir, version string, account *runAs) (dir string, created bool, err error) {
	uid := os.Geteuid()
	if account != nil {
		uid = account.uid
	}
	dir = filepath.Join(baseDir, fmt.Sprintf("%s%s-pg%s-uid%d", templateDirPrefix, templateFormat, version, uid))
	if templateComplete(dir) {
		return dir, false, nil
	}

	buildDir, err := newWorkDir(baseDir, clusterDirPrefix+"template-", account)
	if err != nil {
		return "", false, err
	}
	defer os.RemoveAll(buildDir)
	dataDir := filepath.Join(buildDir, "data")

	// Every connection, over TCP or the Unix socket, must give the postgres role's password: with
	// trust, any local account could connect as superuser. initdb wants a password for that, so
	// the template gets a random one that is thrown away here; each cluster sets its own before it
	// first listens (setPassword), so no two clusters share one and nobody knows the template's.
	pwFile := filepath.Join(buildDir, "pwfile")
	if err := os.WriteFile(pwFile, []byte(randomHex(16)+"\n"), 0o600); err != nil {
		return "", false, fmt.Errorf("pgtest: initdb password file: %w", err)
	}
	if account != nil {
		if err := os.Chown(pwFile, account.uid, account.gid); err != nil {
			return "", false, fmt.Errorf("pgtest: hand the initdb password file to user %s: %w", account.name, err)
		}
	}

	// 1 MB WAL segments instead of 16: the first segment is preallocated, and it was 40% of the
	// bytes every start copies.
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "initdb"),
		"-D", dataDir, "-U", "postgres", "-A", "scram-sha-256", "--pwfile", pwFile,
		"-E", "UTF8", "--locale=C", "--no-sync", "--wal-segsize=1")
	var output bytes.Buffer
	cmd.Stdout = &output
	cmd.Stderr = &output
	cmd.Dir = buildDir
	cmd.Env = childEnv()
	configureChild(cmd, account)
	if err := runPinned(cmd); err != nil {
		return "", false, fmt.Errorf("pgtest: initdb: %w\n%s", err, lastLines(output.String(), 30))
	}

	if err := os.Rename(dataDir, dir); err != nil {
		if templateComplete(dir) {
			return dir, false, nil // another process got there first
		}
		return "", false, fmt.Errorf("pgtest: cache template: %w", err)
	}
	return dir, true, nil
}

func templateComplete(dir string) bool {
	for _, name := range []string{"PG_VERSION", "postgresql.conf", "pg_hba.conf", filepath.Join("global", "pg_control")} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return false
		}
	}
	return true
}

// newWorkDir makes an empty directory under baseDir, records us as its owner, and hands it to
// account, which must be able to create files in it.
func newWorkDir(baseDir, prefix string, account *runAs) (string, error) {
	dir, err := os.MkdirTemp(baseDir, prefix+"*")
	if err != nil {
		return "", fmt.Errorf("pgtest: make directory: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFileName), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("pgtest: write owner file: %w", err)
	}
	if account != nil {
		if err := os.Chown(dir, account.uid, account.gid); err != nil {
			_ = os.RemoveAll(dir)
			return "", fmt.Errorf("pgtest: hand %s to user %s: %w", dir, account.name, err)
		}
	}
	return dir, nil
}

// removeAbandonedDirs removes what killed runs left under baseDir: directories whose owner process
// and postmaster are both gone. Anything it cannot read, it leaves alone.
func removeAbandonedDirs(baseDir string, logf func(string, ...any)) {
	entries, err := os.ReadDir(baseDir)
	if err != nil {
		return
	}
	for _, entry := range entries {
		if !entry.IsDir() || !strings.HasPrefix(entry.Name(), clusterDirPrefix) {
			continue
		}
		dir := filepath.Join(baseDir, entry.Name())
		if !dirAbandoned(dir) {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			logf("pgtest: remove abandoned %s: %v", dir, err)
			continue
		}
		logf("pgtest: removed abandoned %s", dir)
	}
}

func dirAbandoned(dir string) bool {
	owner, err := readPIDFile(filepath.Join(dir, ownerFileName))
	switch {
	case err == nil:
		if processAlive(owner) {
			return false
		}
	case errors.Is(err, fs.ErrNotExist):
		info, err := os.Stat(dir)
		if err != nil || time.Since(info.ModTime()) < abandonedDirAge {
			return false
		}
	default:
		return false
	}
	postmaster, err := readPIDFile(filepath.Join(dir, "data", "postmaster.pid"))
	switch {
	case err == nil:
		return !processAlive(postmaster)
	case errors.Is(err, fs.ErrNotExist):
		return true
	default:
		return false
	}
}

// readPIDFile reads the pid on the first line of an owner file or a postmaster.pid.
func readPIDFile(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(data), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pgtest: %s: no pid on its first line", path)
	}
	return pid, nil
}

// copyTree copies the template's files, keeping their permissions (postgres insists on 0700 or
// 0750 for the data directory), and gives them to account.
func copyTree(src, dst string, account *runAs) error {
	return filepath.WalkDir(src, func(path string, entry fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := entry.Info()
		if err != nil {
			return err
		}
		switch {
		case entry.IsDir():
			err = os.Mkdir(target, info.Mode().Perm())
		case entry.Type()&fs.ModeSymlink != 0:
			var link string
			if link, err = os.Readlink(path); err == nil {
				err = os.Symlink(link, target)
			}
		case entry.Type().IsRegular():
			err = copyFile(path, target, info.Mode().Perm())
		default:
			return nil // sockets and the like belong to a running server, not a template
		}
		if err != nil {
			return err
		}
		if account != nil {
			return os.Lchown(target, account.uid, account.gid)
		}
		return nil
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

// findBinDir finds a directory holding both postgres and initdb: on PATH, from pg_config, or the
// highest version Debian's packages installed under /usr/lib/postgresql (not on PATH by default).
func findBinDir() (string, error) {
	var candidates []string
	for _, name := range []string{"postgres", "initdb"} {
		if path, err := exec.LookPath(name); err == nil {
			// Resolve symlinks: /usr/local/bin/postgres -> /usr/lib/postgresql/15/bin/postgres
			// must find its initdb beside the real file.
			if real, err := filepath.EvalSymlinks(path); err == nil {
				candidates = append(candidates, filepath.Dir(real))
			}
			candidates = append(candidates, filepath.Dir(path))
		}
	}
	if pgConfig, err := exec.LookPath("pg_config"); err == nil {
		if out, err := exec.Command(pgConfig, "--bindir").Output(); err == nil {
			candidates = append(candidates, strings.TrimSpace(string(out)))
		}
	}
	debianDirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	var installed []string
	for _, dir := range debianDirs {
		if hasServerBinaries(dir) {
			installed = append(installed, dir)
		}
	}
	if highest := highestVersionDir(installed); highest != "" {
		candidates = append(candidates, highest)
	}
	for _, dir := range candidates {
		if hasServerBinaries(dir) {
			return dir, nil
		}
	}
	return "", unavailable(KindLocal, "no PostgreSQL server binaries (postgres and initdb) on PATH, in `pg_config --bindir`, or under /usr/lib/postgresql/*/bin")
}

func hasServerBinaries(dir string) bool {
	for _, name := range []string{"postgres", "initdb"} {
		info, err := os.Stat(filepath.Join(dir, name))
		if err != nil || !info.Mode().IsRegular() || info.Mode().Perm()&0o111 == 0 {
			return false
		}
	}
	return true
}

// highestVersionDir picks, from paths like /usr/lib/postgresql/<version>/bin, the one with the
// highest version, comparing numerically: 9.6 < 10 < 15 < 16.
func highestVersionDir(dirs []string) string {
	best, bestVersion := "", []int(nil)
	for _, dir := range dirs {
		version := parseVersion(filepath.Base(filepath.Dir(dir)))
		if version == nil {
			continue
		}
		if best == "" || compareVersions(version, bestVersion) > 0 {
			best, bestVersion = dir, version
		}
	}
	return best
}

func parseVersion(s string) []int {
	var version []int
	for _, part := range strings.Split(s, ".") {
		n, err := strconv.Atoi(part)
		if err != nil {
			return nil
		}
		version = append(version, n)
	}
	return version
}

func compareVersions(a, b []int) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] - b[i]
		}
	}
	return len(a) - len(b)
}

var versionPattern = regexp.MustCompile(`\(PostgreSQL\) ([0-9][0-9A-Za-z.]*)`)

// postgresVersion reads "15.14" out of "postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)".
func postgresVersion(binDir string) (string, error) {
	out, err := exec.Command(filepath.Join(binDir, "postgres"), "--version").Output()
	if err != nil {
		return "", fmt.Errorf("pgtest: %s --version: %w", filepath.Join(binDir, "postgres"), err)
	}
	match := versionPattern.FindSubmatch(out)
	if match == nil {
		return "", fmt.Errorf("pgtest: unrecognised output of postgres --version: %q", strings.TrimSpace(string(out)))
	}
	return string(match[1]), nil
}

// lookupRunAs returns the account to run PostgreSQL as: nil (ourselves) unless we are root.
func lookupRunAs() (*runAs, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, unavailable(KindLocal,
			"running as root, which initdb refuses, and there is no \"postgres\" system user to run it as (%v); create one (useradd --system postgres) or run as a normal user", err)
	}
	uid, uidErr := strconv.Atoi(u.Uid)
	gid, gidErr := strconv.Atoi(u.Gid)
	if uidErr != nil || gidErr != nil {
		return nil, unavailable(KindLocal, "user postgres has a non-numeric uid %q or gid %q", u.Uid, u.Gid)
	}
	return &runAs{name: u.Username, uid: uid, gid: gid}, nil
}

// checkReachable fails early, with advice, when account could not reach dir: otherwise initdb would
// fail later with a bare "permission denied". Only mode bits are considered, which is all a process
// with no supplementary groups (as configureChild sets up) gets.
func checkReachable(dir string, account *runAs) error {
	if account == nil {
		return nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("pgtest: temp dir %s: %w", dir, err)
	}
	for d := abs; ; d = filepath.Dir(d) {
		info, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("pgtest: temp dir: %w", err)
		}
		uid, gid, ok := fileOwner(info)
		if ok {
			perm := info.Mode().Perm()
			var search fs.FileMode
			switch {
			case uid == account.uid:
				search = perm & 0o100
			case gid == account.gid:
				search = perm & 0o010
			default:
				search = perm & 0o001
			}
			if search == 0 {
				return fmt.Errorf("pgtest: running as root, PostgreSQL runs as user %s, who cannot enter %s (mode %v) to reach %s; set TMPDIR (or Options.TempDir) to a directory it can reach, such as /tmp",
					account.name, d, info.Mode().Perm(), abs)
			}
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// childEnv is our environment without the libpq variables, which would otherwise steer initdb and
// postgres, and in the C locale, so server messages are the English ones we look for.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C")
}

func tailFile(path string, lines int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	return lastLines(string(data), lines)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
