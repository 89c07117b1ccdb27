package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Mode selects where [Start] gets its server from.
type Mode string

const (
	// ModeAuto tries external, then local, then docker.
	ModeAuto Mode = ""
	// ModeExternal uses only the server named by the URL environment variable.
	ModeExternal Mode = "external"
	// ModeLocal uses only a throwaway cluster run from the local PostgreSQL binaries.
	ModeLocal Mode = "local"
	// ModeDocker uses only a postgres container on a Docker engine.
	ModeDocker Mode = "docker"
)

// Kinds of server, as reported by [Server.Kind].
const (
	KindExternal = "external"
	KindLocal    = "local"
	KindDocker   = "docker"
)

// ModeEnv is the environment variable that forces one source when [Options.Mode] is empty.
const ModeEnv = "IDEM_PGTEST_MODE"

// DefaultURLEnv is the environment variable naming an existing server, unless [Options.URLEnv] says
// otherwise.
const DefaultURLEnv = "TEST_DATABASE_URL"

var (
	// ErrNoServer is returned by Start when no source of PostgreSQL is available. Its message says
	// how to provide one.
	ErrNoServer = errors.New("pgtest: no PostgreSQL server available")

	// ErrNotCreated is returned by DropDatabase for a database this Server did not create: pgtest
	// never drops anything else, least of all on a server it does not own.
	ErrNotCreated = errors.New("pgtest: database was not created by this server")

	// ErrInvalidName is returned for a database prefix that is not a plain lowercase identifier.
	ErrInvalidName = errors.New("pgtest: invalid name")

	// ErrInvalidMode is returned for a mode other than external, local or docker.
	ErrInvalidMode = errors.New("pgtest: invalid mode")

	// ErrClosed is returned by methods of a Server that has been closed.
	ErrClosed = errors.New("pgtest: server is closed")
)

// Options configure [Start]. The zero value (or nil) is ready to use.
type Options struct {
	// URLEnv is the environment variable holding the URL of an existing server. Default
	// TEST_DATABASE_URL.
	URLEnv string

	// Logf receives progress messages (which source was used, how long it took, what was cleaned
	// up). Nil discards them.
	Logf func(format string, args ...any)

	// Mode forces one source. Empty means the value of IDEM_PGTEST_MODE, and when that is empty
	// too, the first available of external, local and docker.
	Mode Mode

	// TempDir is where local clusters and the cached template live. Default os.TempDir(). When
	// running as root it must be reachable by the postgres user.
	TempDir string

	// DockerEndpoint is the Docker engine to use. Default: DOCKER_HOST, else the platform's
	// default socket.
	DockerEndpoint string

	// Settings are extra server settings ("name=value") for a cluster or container that Start
	// starts, applied after its own speed-over-durability defaults, so they can override them
	// (a benchmark sizing shared_buffers for its table, say). An external server is used as it
	// is. Default none.
	Settings []string
}

// config is Options with defaults applied.
type config struct {
	urlEnv         string
	logf           func(format string, args ...any)
	mode           Mode
	modeFromEnv    bool
	tempDir        string
	dockerEndpoint string
	settings       []string // server settings for a cluster we start: the defaults, then Options.Settings
}

func (o *Options) config() (*config, error) {
	if o == nil {
		o = &Options{}
	}
	cfg := &config{
		urlEnv:         o.URLEnv,
		logf:           o.Logf,
		mode:           o.Mode,
		tempDir:        o.TempDir,
		dockerEndpoint: o.DockerEndpoint,
		settings:       append(slices.Clip(serverSettings), o.Settings...),
	}
	for _, setting := range o.Settings {
		if name, _, ok := strings.Cut(setting, "="); !ok || strings.TrimSpace(name) == "" {
			return nil, fmt.Errorf("pgtest: server setting %q is not name=value", setting)
		}
	}
	if cfg.urlEnv == "" {
		cfg.urlEnv = DefaultURLEnv
	}
	if cfg.logf == nil {
		cfg.logf = func(string, ...any) {}
	}
	if cfg.mode == ModeAuto {
		cfg.mode = Mode(strings.TrimSpace(os.Getenv(ModeEnv)))
		cfg.modeFromEnv = cfg.mode != ModeAuto
	}
	switch cfg.mode {
	case ModeAuto, ModeExternal, ModeLocal, ModeDocker:
	default:
		source := "Options.Mode"
		if cfg.modeFromEnv {
			source = ModeEnv
		}
		return nil, fmt.Errorf("%w: %s=%q; use external, local, docker, or leave it empty to try each in turn",
			ErrInvalidMode, source, cfg.mode)
	}
	if cfg.tempDir == "" {
		cfg.tempDir = os.TempDir()
	}
	return cfg, nil
}

// unavailableError says that a source cannot be used on this machine, as opposed to a source that
// is there but failed. Start moves on to the next source only after the former.
type unavailableError struct {
	source string
	reason string
}

func (e *unavailableError) Error() string { return e.source + ": " + e.reason }

func unavailable(source, format string, args ...any) error {
	return &unavailableError{source: source, reason: fmt.Sprintf(format, args...)}
}

// Server is a PostgreSQL server to run tests against. It is safe for concurrent use.
type Server struct {
	kind     string
	adminURL string
	logf     func(format string, args ...any)
	admin    *pgxpool.Pool
	local    *localCluster // set for KindLocal
	stop     func() error  // tears down what Start set up; nil for an external server

	mu      sync.Mutex
	created map[string]struct{}
	closed  bool

	closeOnce sync.Once
	closeErr  error
}

// Start returns a running server from the first available source (see the package doc). The
// context bounds the start-up only; the server runs until Close.
func Start(ctx context.Context, opts *Options) (*Server, error) {
	cfg, err := opts.config()
	if err != nil {
		return nil, err
	}

	type source struct {
		name  string
		start func(context.Context, *config) (*Server, error)
	}
	sources := []source{
		{KindExternal, startExternal},
		{KindLocal, startLocal},
		{KindDocker, startDocker},
	}
	if cfg.mode != ModeAuto {
		for _, s := range sources {
			if s.name == string(cfg.mode) {
				sources = []source{s}
				break
			}
		}
	}

	var reasons []string
	for _, s := range sources {
		server, err := s.start(ctx, cfg)
		if err == nil {
			return server, nil
		}
		var unavailableErr *unavailableError
		if !errors.As(err, &unavailableErr) {
			return nil, err
		}
		cfg.logf("pgtest: %v", unavailableErr)
		reasons = append(reasons, unavailableErr.Error())
	}
	return nil, noServerError(cfg, reasons)
}

func noServerError(cfg *config, reasons []string) error {
	var b strings.Builder
	if cfg.mode != ModeAuto {
		fmt.Fprintf(&b, " (mode %s", cfg.mode)
		if cfg.modeFromEnv {
			fmt.Fprintf(&b, " from %s", ModeEnv)
		}
		b.WriteString(")")
	}
	fmt.Fprintf(&b, ": %s.\n", strings.Join(reasons, "; "))
	b.WriteString("Provide one of:\n")
	fmt.Fprintf(&b, "  - an existing server: set %s=postgres://USER:PASSWORD@HOST:5432/postgres (the role needs CREATEDB)\n", cfg.urlEnv)
	b.WriteString("  - the PostgreSQL server binaries (initdb, postgres): install the server package, e.g. `apt-get install postgresql`; no running service is needed\n")
	b.WriteString("  - a running Docker engine (check with `docker info`), used to run postgres:15")
	if cfg.mode != ModeAuto {
		fmt.Fprintf(&b, "\nor unset %s to let pgtest try each in turn", ModeEnv)
	}
	return fmt.Errorf("%w%s", ErrNoServer, b.String())
}

func newServer(kind, adminURL string, logf func(string, ...any)) (*Server, error) {
	poolConfig, err := pgxpool.ParseConfig(adminURL)
	if err != nil {
		return nil, fmt.Errorf("pgtest: parse admin URL: %w", err)
	}
	poolConfig.MaxConns = 4
	admin, err := pgxpool.NewWithConfig(context.Background(), poolConfig)
	if err != nil {
		return nil, fmt.Errorf("pgtest: admin pool: %w", err)
	}
	return &Server{
		kind:     kind,
		adminURL: adminURL,
		logf:     logf,
		admin:    admin,
		created:  make(map[string]struct{}),
	}, nil
}

// Kind reports where the server came from: "external", "local" or "docker".
func (s *Server) Kind() string { return s.kind }

// AdminURL is a connection URL to the server's maintenance database, as a superuser for local and
// docker servers, and exactly as given for an external one.
func (s *Server) AdminURL() string { return s.adminURL }

var prefixPattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,39}$`)

// CreateDatabase creates an empty database named prefix_<random hex> and returns its URL. An empty
// prefix means "idem_test". The database is dropped by DropDatabase, or, on an external server, by
// Close at the latest.
func (s *Server) CreateDatabase(ctx context.Context, prefix string) (string, error) {
	if prefix == "" {
		prefix = "idem_test"
	}
	if !prefixPattern.MatchString(prefix) {
		return "", fmt.Errorf("%w: database prefix %q must be a lowercase letter followed by at most 39 lowercase letters, digits or underscores",
			ErrInvalidName, prefix)
	}
	if err := s.checkOpen(); err != nil {
		return "", err
	}
	name := prefix + "_" + randomHex(8)
	if _, err := s.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("pgtest: create database %s: %w", name, err)
	}
	s.mu.Lock()
	s.created[name] = struct{}{}
	s.mu.Unlock()

	// The marker lets a later Start against the same external server recognise, and drop, the
	// databases of a test binary that was killed before it could.
	comment := "COMMENT ON DATABASE " + pgx.Identifier{name}.Sanitize() + " IS " + quoteLiteral(newMarker().String())
	if _, err := s.admin.Exec(ctx, comment); err != nil {
		return "", fmt.Errorf("pgtest: mark database %s: %w", name, err)
	}
	return s.databaseURL(name)
}

// DropDatabase drops a database made by CreateDatabase, given its URL, disconnecting its sessions
// (WITH (FORCE), PostgreSQL 13 or later). A database this Server did not create is refused with
// ErrNotCreated.
func (s *Server) DropDatabase(ctx context.Context, databaseURL string) error {
	u, err := url.Parse(databaseURL)
	name := ""
	if err == nil {
		name = strings.TrimPrefix(u.Path, "/")
	}
	if name == "" {
		return fmt.Errorf("pgtest: drop database: %q is not a URL with a database name", redactURL(databaseURL))
	}
	if err := s.checkOpen(); err != nil {
		return err
	}
	s.mu.Lock()
	_, ok := s.created[name]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s", ErrNotCreated, name)
	}
	if err := s.dropDatabase(ctx, name); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.created, name)
	s.mu.Unlock()
	return nil
}

func (s *Server) dropDatabase(ctx context.Context, name string) error {
	if _, err := s.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("pgtest: drop database %s: %w", name, err)
	}
	return nil
}

func (s *Server) checkOpen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	return nil
}

// Close drops the databases still left on an external server, or stops and removes a local or
// docker one. It is safe to call more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		var names []string
		for name := range s.created {
			names = append(names, name)
		}
		s.mu.Unlock()

		var errs []error
		if s.kind == KindExternal {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			for _, name := range names {
				errs = append(errs, s.dropDatabase(ctx, name))
			}
			cancel()
		}
		s.admin.Close()
		if s.stop != nil {
			errs = append(errs, s.stop())
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

func (s *Server) databaseURL(name string) (string, error) {
	u, err := url.Parse(s.adminURL)
	if err != nil {
		return "", fmt.Errorf("pgtest: parse admin URL: %w", err)
	}
	u.Path = "/" + name
	u.RawPath = ""
	return u.String(), nil
}

// startExternal uses the server the developer pointed us at. It is never created or destroyed here,
// and only databases carrying our marker are ever dropped.
func startExternal(ctx context.Context, cfg *config) (*Server, error) {
	raw := strings.TrimSpace(os.Getenv(cfg.urlEnv))
	if raw == "" {
		return nil, unavailable(KindExternal, "%s is not set", cfg.urlEnv)
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, fmt.Errorf("pgtest: %s must be a postgres:// URL such as postgres://postgres@127.0.0.1:5432/postgres, got %q",
			cfg.urlEnv, redactURL(raw))
	}
	server, err := newServer(KindExternal, raw, cfg.logf)
	if err != nil {
		return nil, err
	}
	pingCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := server.admin.Ping(pingCtx); err != nil {
		server.admin.Close()
		return nil, fmt.Errorf("pgtest: %s is set to %s, but that server does not answer: %w", cfg.urlEnv, u.Redacted(), err)
	}
	server.removeAbandonedDatabases(ctx)
	cfg.logf("pgtest: using external PostgreSQL at %s", u.Redacted())
	return server, nil
}

// abandonedAfter is how old a marked database must be before any Start may drop it, whoever made it.
const abandonedAfter = 24 * time.Hour

// removeAbandonedDatabases drops databases made by an earlier pgtest whose process is gone: on this
// host when its pid is dead, anywhere when it is older than abandonedAfter. Failures only cost disk
// space on the external server, so they are logged, not returned.
func (s *Server) removeAbandonedDatabases(ctx context.Context) {
	rows, err := s.admin.Query(ctx, `
		SELECT datname, shobj_description(oid, 'pg_database')
		FROM pg_database
		WHERE shobj_description(oid, 'pg_database') LIKE 'idem-pgtest %'`)
	if err != nil {
		s.logf("pgtest: list abandoned databases: %v", err)
		return
	}
	type database struct{ name, comment string }
	databases, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (database, error) {
		var d database
		err := row.Scan(&d.name, &d.comment)
		return d, err
	})
	if err != nil {
		s.logf("pgtest: list abandoned databases: %v", err)
		return
	}
	self := newMarker()
	for _, d := range databases {
		m, ok := parseMarker(d.comment)
		if !ok {
			continue
		}
		orphaned := m.host == self.host && m.pid != self.pid && !processAlive(m.pid)
		if !orphaned && time.Since(m.created) < abandonedAfter {
			continue
		}
		if err := s.dropDatabase(ctx, d.name); err != nil {
			s.logf("pgtest: drop abandoned database: %v", err)
			continue
		}
		s.logf("pgtest: dropped abandoned database %s (%s)", d.name, d.comment)
	}
}

// marker identifies the process that created a database, in the database's comment.
type marker struct {
	host    string
	pid     int
	created time.Time
}

func newMarker() marker {
	host, _ := os.Hostname()
	return marker{host: host, pid: os.Getpid(), created: time.Now().UTC()}
}

func (m marker) String() string {
	return fmt.Sprintf("idem-pgtest host=%s pid=%d created=%s", m.host, m.pid, m.created.Format(time.RFC3339))
}

func parseMarker(s string) (marker, bool) {
	fields := strings.Fields(s)
	if len(fields) != 4 || fields[0] != "idem-pgtest" {
		return marker{}, false
	}
	values := make(map[string]string)
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return marker{}, false
		}
		values[k] = v
	}
	pid, err := strconv.Atoi(values["pid"])
	if err != nil {
		return marker{}, false
	}
	created, err := time.Parse(time.RFC3339, values["created"])
	if err != nil {
		return marker{}, false
	}
	return marker{host: values["host"], pid: pid, created: created}, true
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b)
}

func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// redactURL hides a password in something that may or may not parse as a URL.
func redactURL(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return u.Redacted()
	}
	return "(unparseable URL)"
}

// withQueryParam returns rawURL with key=value added to its query.
func withQueryParam(rawURL, key, value string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("pgtest: parse URL: %w", err)
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String(), nil
}
