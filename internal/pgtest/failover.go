package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idem/idem/internal/pgproxy"
)

// StandbyApplicationName is the standby's application_name: what pg_stat_replication calls it on
// the primary, and what synchronous_standby_names names on a synchronous pair.
const StandbyApplicationName = "pgtest_standby"

// standbySlot is the physical replication slot the standby streams from, so that the primary keeps
// the WAL a held-back standby has yet to receive.
const standbySlot = "pgtest_standby"

const (
	// pairStartTimeout bounds NewPair's start.
	pairStartTimeout = 10 * time.Minute
	// pollInterval is how often the pair asks a server whether what it waits for has happened.
	pairPollInterval = 10 * time.Millisecond
)

// pairSettings are what a replicating pair needs on top of serverSettings, on both servers (a
// standby that is promoted becomes a primary):
//
//   - synchronous_commit=on, because serverSettings turn it off: a commit must have reached the
//     primary's WAL when it returns, for WaitCaughtUp to mean anything, and on a synchronous pair it
//     must wait for the standby;
//   - small WAL (1 MB segments from the template), and a retry interval of 200ms rather than 5s for
//     a standby whose connection to the primary broke;
//   - fewer connections and buffers than a cluster shared by a whole test binary: a pair is one
//     test's.
var pairSettings = []string{
	"synchronous_commit=on",
	"wal_level=replica",
	"max_wal_senders=4",
	"max_replication_slots=4",
	"hot_standby=on",
	"min_wal_size=2MB",
	"max_wal_size=32MB",
	"wal_retrieve_retry_interval=200ms",
	"max_connections=50",
	"shared_buffers=32MB",
}

// PairOptions configure [StartPair]. The zero value (or nil) is ready to use: an asynchronous pair.
type PairOptions struct {
	// Synchronous makes the standby synchronous: the primary's synchronous_standby_names names it
	// ([StandbyApplicationName]) and synchronous_commit is on, so a commit on the primary returns
	// only once the standby has flushed it. The standby's own synchronous_standby_names is empty, so
	// that once promoted it does not wait for a standby it does not have.
	Synchronous bool

	// TempDir is where the two clusters and the cached template live. Default os.TempDir(). When
	// running as root it must be reachable by the postgres user.
	TempDir string

	// Logf receives progress messages. Nil discards them.
	Logf func(format string, args ...any)

	// Settings are extra server settings ("name=value") for both servers, applied last.
	Settings []string
}

// Pair is a primary and a streaming standby made from the local PostgreSQL binaries, for tests of
// what happens to idem across a failover. The standby's replication connection goes through a proxy
// inside the Pair, which [Pair.HoldReplication] stalls, so a test can make the standby fall behind,
// then kill the primary and promote the standby.
//
// Both servers listen on 127.0.0.1 and have the same superuser password (the standby is a base
// backup of the primary). Every URL connects to the postgres database as the postgres role.
//
// The methods are safe for concurrent use, except that KillPrimary, Promote and Close are meant to
// be called one at a time.
type Pair struct {
	primary     *localCluster
	standby     *localCluster
	proxy       *pgproxy.Proxy
	synchronous bool
	logf        func(format string, args ...any)

	closeOnce sync.Once
	closeErr  error
}

// NewPair starts a pair for a test, and stops it and removes its directories when the test ends.
// It skips the test when this machine has no local PostgreSQL binaries, the pair's only source
// (neither TEST_DATABASE_URL nor Docker can provide a pair), and fails it for any other error.
func NewPair(t testing.TB, opts *PairOptions) *Pair {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), pairStartTimeout)
	defer cancel()
	pair, err := StartPair(ctx, opts)
	if errors.Is(err, ErrNoServer) {
		t.Skipf("no primary and standby to test with: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pair.Close(); err != nil {
			t.Errorf("%v", err)
		}
	})
	return pair
}

// StartPair starts a primary from the cached template, takes a base backup of it with
// pg_basebackup, and starts that as a standby streaming from the primary through the proxy. It
// returns once the standby streams (and, on a synchronous pair, is the synchronous standby). The
// context bounds the start only. An error wrapping [ErrNoServer] means this machine has no local
// PostgreSQL binaries to make a pair from.
func StartPair(ctx context.Context, opts *PairOptions) (*Pair, error) {
	if opts == nil {
		opts = &PairOptions{}
	}
	cfg, err := (&Options{Mode: ModeLocal, TempDir: opts.TempDir, Logf: opts.Logf, Settings: opts.Settings}).config()
	if err != nil {
		return nil, err
	}
	began := time.Now()
	env, err := prepareLocal(ctx, cfg)
	if err != nil {
		var unavailableErr *unavailableError
		if errors.As(err, &unavailableErr) {
			return nil, fmt.Errorf("%w: a pair needs the local PostgreSQL binaries: %v", ErrNoServer, err)
		}
		return nil, err
	}
	basebackup := filepath.Join(env.binDir, "pg_basebackup")
	if _, err := os.Stat(basebackup); err != nil {
		return nil, fmt.Errorf("%w: a pair needs pg_basebackup beside postgres: %v", ErrNoServer, err)
	}

	standbySettings := append(append(slices.Clip(serverSettings), pairSettings...), opts.Settings...)
	primarySettings := append(slices.Clip(serverSettings), pairSettings...)
	if opts.Synchronous {
		primarySettings = append(primarySettings, "synchronous_standby_names="+StandbyApplicationName)
	}
	primarySettings = append(primarySettings, opts.Settings...)

	p := &Pair{synchronous: opts.Synchronous, logf: cfg.logf}
	fail := func(err error) (*Pair, error) { return nil, errors.Join(err, p.Close()) }

	if p.primary, err = env.newCluster(primarySettings); err != nil {
		return fail(err)
	}
	if err := p.primary.fromTemplate(ctx); err != nil {
		return fail(err)
	}
	if err := p.primary.start(ctx); err != nil {
		return fail(fmt.Errorf("pgtest: start the primary: %w", err))
	}
	primaryStarted := time.Now()

	if p.proxy, err = pgproxy.Start(ctx, "127.0.0.1:"+strconv.Itoa(p.primary.port)); err != nil {
		return fail(err)
	}
	if p.standby, err = env.newCluster(standbySettings); err != nil {
		return fail(err)
	}
	if err := p.standby.baseBackup(ctx, p.primary, p.proxy.Port()); err != nil {
		return fail(err)
	}
	backedUp := time.Now()
	if err := p.standby.start(ctx); err != nil {
		return fail(fmt.Errorf("pgtest: start the standby: %w", err))
	}
	if err := p.waitStreaming(ctx); err != nil {
		return fail(err)
	}

	mode := "asynchronous"
	if p.synchronous {
		mode = "synchronous"
	}
	cfg.logf("pgtest: %s pair of PostgreSQL %s ready in %s (primary %s, base backup %s, standby %s): primary 127.0.0.1:%d, standby 127.0.0.1:%d replicating through 127.0.0.1:%d",
		mode, env.version, time.Since(began).Round(time.Millisecond),
		primaryStarted.Sub(began).Round(time.Millisecond), backedUp.Sub(primaryStarted).Round(time.Millisecond),
		time.Since(backedUp).Round(time.Millisecond), p.primary.port, p.standby.port, p.proxy.Port())
	return p, nil
}

// baseBackup makes c's data directory a base backup of primary, configured as a standby that
// streams from the proxy listening on proxyPort.
func (c *localCluster) baseBackup(ctx context.Context, primary *localCluster, proxyPort int) error {
	args := []string{
		"-D", c.dataDir,
		"-h", "127.0.0.1", "-p", strconv.Itoa(primary.port), "-U", "postgres", "-w",
		"-X", "stream", // the WAL written while it copies, over a second connection
		"--checkpoint=fast",
		"--no-sync",                              // like fsync=off: nothing here must survive the machine
		"--create-slot", "--slot=" + standbySlot, // the WAL is kept for the standby from the start
	}
	if major := majorVersion(c.env.version); major == 0 || major >= 13 {
		args = append(args, "--no-manifest") // nothing will verify it
	}
	cmd := exec.CommandContext(ctx, filepath.Join(c.env.binDir, "pg_basebackup"), args...)
	var output strings.Builder
	cmd.Stdout = &output
	cmd.Stderr = &output
	cmd.Dir = c.workDir
	// In the environment, not on the command line, where any local user could read it.
	cmd.Env = append(childEnv(), "PGPASSWORD="+primary.password)
	configureChild(cmd, c.env.account)
	if err := runPinned(cmd); err != nil {
		return fmt.Errorf("pgtest: pg_basebackup of the primary: %w\n%s", err, lastLines(output.String(), 30))
	}
	c.password = primary.password // pg_authid came with the backup

	// The standby's configuration, with the password, goes into the data directory, which only
	// the cluster's OS user may read, rather than onto its command line.
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres password=%s application_name=%s sslmode=disable",
		proxyPort, primary.password, StandbyApplicationName)
	conf := fmt.Sprintf("# pgtest: a standby streaming from the primary through the pair's proxy\nprimary_conninfo = %s\nprimary_slot_name = %s\n",
		quoteLiteral(conninfo), quoteLiteral(standbySlot))
	if err := c.appendDataFile("postgresql.auto.conf", conf); err != nil {
		return err
	}
	return c.appendDataFile("standby.signal", "")
}

// appendDataFile appends text to a file in the data directory, creating it, private to the
// cluster's OS user, if need be.
func (c *localCluster) appendDataFile(name, text string) error {
	path := filepath.Join(c.dataDir, name)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err == nil {
		_, err = f.WriteString(text)
		err = errors.Join(err, f.Close())
	}
	if err == nil && c.env.account != nil {
		err = os.Chown(path, c.env.account.uid, c.env.account.gid)
	}
	if err != nil {
		return fmt.Errorf("pgtest: write %s: %w", path, err)
	}
	return nil
}

// majorVersion reads 15 out of "15.14" or "16beta1"; 0 when there is no leading number.
func majorVersion(version string) int {
	end := strings.IndexFunc(version, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(version)
	}
	n, _ := strconv.Atoi(version[:end])
	return n
}

// waitStreaming waits until the primary reports the standby streaming, and synchronous on a
// synchronous pair.
func (p *Pair) waitStreaming(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, p.PrimaryURL())
	if err != nil {
		return fmt.Errorf("pgtest: connect to the primary: %w", err)
	}
	defer conn.Close(context.Background())
	want := "async"
	if p.synchronous {
		want = "sync"
	}
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		var state string
		err := conn.QueryRow(ctx,
			"SELECT sync_state FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'",
			StandbyApplicationName).Scan(&state)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return state == want, err
	})
	if err != nil {
		return fmt.Errorf("pgtest: wait for the standby to stream (%s): %w\n--- end of the standby's server.log ---\n%s",
			want, err, tailFile(filepath.Join(p.standby.workDir, "server.log"), 20))
	}
	return nil
}

// URL connects to whichever of the two servers accepts writes: both are listed, the primary first,
// with target_session_attrs=read-write, so pgx skips a server that is down or read-only. Before a
// failover that is the primary; after KillPrimary and Promote, the promoted standby. (Were the
// standby promoted with the primary still up, both would accept writes and URL would pick the
// first, the old primary.)
func (p *Pair) URL() string {
	hosts := "127.0.0.1:" + strconv.Itoa(p.primary.port) + ",127.0.0.1:" + strconv.Itoa(p.standby.port)
	return p.primary.url(hosts) + "&target_session_attrs=read-write&connect_timeout=10"
}

// PrimaryURL connects to the server started as the primary, whatever has happened to it since.
func (p *Pair) PrimaryURL() string { return p.primary.adminURL() }

// StandbyURL connects to the server started as the standby, whatever has happened to it since:
// read-only until Promote, then the new primary.
func (p *Pair) StandbyURL() string { return p.standby.adminURL() }

// HoldReplication stalls the standby's replication connection, both ways: once it returns, no
// byte of WAL reaches the standby, and no acknowledgement reaches the primary, until
// ReleaseReplication. On an asynchronous pair commits on the primary go on succeeding, and are lost
// if it is killed and the standby promoted; on a synchronous one they wait. A connection held for
// longer than wal_receiver_timeout and wal_sender_timeout (a minute) is dropped by the servers; the
// standby's attempts to reconnect are held too.
func (p *Pair) HoldReplication() { p.proxy.Hold() }

// ReleaseReplication lets the replication connection flow again, so the standby catches up.
func (p *Pair) ReleaseReplication() { p.proxy.Resume() }

// WaitCaughtUp waits until the standby has replayed the WAL the primary had written when it was
// called (its pg_current_wal_lsn), so every transaction committed before the call is visible on
// the standby. It waits for as long as the context lets it, whatever holds the standby back.
func (p *Pair) WaitCaughtUp(ctx context.Context) error {
	target, err := queryLSN(ctx, p.PrimaryURL(), "pg_current_wal_lsn()")
	if err != nil {
		return fmt.Errorf("pgtest: the primary's WAL position: %w", err)
	}
	conn, err := pgx.Connect(ctx, p.StandbyURL())
	if err != nil {
		return fmt.Errorf("pgtest: connect to the standby: %w", err)
	}
	defer conn.Close(context.Background())
	var replayed int64
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		var err error
		replayed, err = scanLSN(conn.QueryRow(ctx, "SELECT "+lsnQuery("pg_last_wal_replay_lsn()")))
		return replayed >= target, err
	})
	if err != nil {
		return fmt.Errorf("pgtest: wait for the standby to replay up to the primary's position (%d bytes behind): %w", target-replayed, err)
	}
	return nil
}

// Lag is how many bytes of WAL the standby has yet to replay: the primary's current position
// (pg_current_wal_lsn) less the standby's replay position (pg_last_wal_replay_lsn), read in that
// order so that it is never negative.
func (p *Pair) Lag(ctx context.Context) (int64, error) {
	replayed, err := queryLSN(ctx, p.StandbyURL(), "pg_last_wal_replay_lsn()")
	if err != nil {
		return 0, fmt.Errorf("pgtest: the standby's replay position: %w", err)
	}
	current, err := queryLSN(ctx, p.PrimaryURL(), "pg_current_wal_lsn()")
	if err != nil {
		return 0, fmt.Errorf("pgtest: the primary's WAL position: %w", err)
	}
	return max(current-replayed, 0), nil
}

// lsnQuery turns an expression of type pg_lsn into a byte position that scans into an int64.
func lsnQuery(expr string) string {
	return "pg_wal_lsn_diff(" + expr + ", '0/0')::bigint"
}

func scanLSN(row pgx.Row) (int64, error) {
	var lsn *int64
	if err := row.Scan(&lsn); err != nil {
		return 0, err
	}
	if lsn == nil {
		return 0, nil // a standby that has replayed nothing yet
	}
	return *lsn, nil
}

func queryLSN(ctx context.Context, url, expr string) (int64, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	return scanLSN(conn.QueryRow(ctx, "SELECT "+lsnQuery(expr)))
}

// KillPrimary kills the primary as a crash would, with no shutdown of any kind: SIGKILL to the
// postmaster and, on Linux, to each of its processes, so none of them writes or sends anything
// more once it returns. The primary is not restarted; its directory goes with Close.
func (p *Pair) KillPrimary() error {
	return p.primary.crash()
}

// Promote promotes the standby (pg_promote) and waits until it accepts writes, after which URL
// connects to it. Kill the primary first, or there are two.
func (p *Pair) Promote(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, p.StandbyURL())
	if err != nil {
		return fmt.Errorf("pgtest: connect to the standby: %w", err)
	}
	defer conn.Close(context.Background())
	var promoted bool
	if err := conn.QueryRow(ctx, "SELECT pg_promote(wait => true, wait_seconds => 300)").Scan(&promoted); err != nil {
		return fmt.Errorf("pgtest: promote the standby: %w", err)
	}
	if !promoted {
		return errors.New("pgtest: promote the standby: pg_promote gave up waiting for the promotion to finish")
	}
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		var writable bool
		err := conn.QueryRow(ctx,
			"SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'").Scan(&writable)
		return writable, err
	})
	if err != nil {
		return fmt.Errorf("pgtest: wait for the promoted standby to accept writes: %w", err)
	}
	p.logf("pgtest: standby 127.0.0.1:%d promoted", p.standby.port)
	return nil
}

// Close stops both servers and the proxy, and removes the servers' directories. It is safe to call
// more than once.
func (p *Pair) Close() error {
	p.closeOnce.Do(func() {
		var errs []error
		if p.proxy != nil {
			errs = append(errs, p.proxy.Close())
		}
		for _, c := range []*localCluster{p.standby, p.primary} {
			if c != nil {
				errs = append(errs, c.stop())
			}
		}
		p.closeErr = errors.Join(errs...)
	})
	return p.closeErr
}

// crash kills the cluster's postgres as a crash would (see KillPrimary), waits until its processes
// are gone, and removes the shared memory segment it had no chance to.
func (c *localCluster) crash() error {
	if c.cmd == nil {
		return errors.New("pgtest: kill: the server is not running")
	}
	select {
	case <-c.exited:
		return errors.New("pgtest: kill: the server has already exited")
	default:
	}
	segment, segmentErr := sysVSegment(filepath.Join(c.dataDir, "postmaster.pid"))

	children := crashProcess(c.cmd.Process)
	<-c.exited
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	err := poll(ctx, func(context.Context) (bool, error) {
		return !slices.ContainsFunc(children, processAlive), nil
	})
	if err != nil {
		return fmt.Errorf("pgtest: kill: processes of the postmaster outlived SIGKILL: %w", err)
	}
	if segmentErr == nil {
		if err := removeSysVSegment(segment); err != nil {
			c.env.cfg.logf("pgtest: remove shared memory segment %d of the killed postmaster: %v", segment, err)
		}
	}
	return nil
}

// sysVSegment reads the id of the postmaster's System V shared memory segment from the seventh line
// of postmaster.pid ("key id").
func sysVSegment(pidFile string) (int, error) {
	data, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, err
	}
	lines := strings.Split(string(data), "\n")
	if len(lines) < 7 {
		return 0, errors.New("no shared memory line")
	}
	fields := strings.Fields(lines[6])
	if len(fields) != 2 {
		return 0, errors.New("no shared memory line")
	}
	return strconv.Atoi(fields[1])
}

// poll calls done until it reports true, returns an error, or the context ends.
func poll(ctx context.Context, done func(context.Context) (bool, error)) error {
	ticker := time.NewTicker(pairPollInterval)
	defer ticker.Stop()
	for {
		ok, err := done(ctx)
		switch {
		case err != nil && ctx.Err() != nil:
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case err != nil:
			return err
		case ok:
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ticker.C:
		}
	}
}
