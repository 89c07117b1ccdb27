// Package migrations holds idem's versioned database schema and applies it.
//
// The SQL lives in sql/ as numbered up/down pairs embedded into the binary, so
// an application migrates with the code it runs:
//
//	m, err := migrations.New(pool, &migrations.Config{Schema: "idem"})
//	res, err := m.Up(ctx) // applies what is pending; a no-op when up to date
//
// Up and Down take a transaction-scoped advisory lock derived from the schema,
// so several processes starting at once apply each migration exactly once,
// and calling them again is harmless. Teams that run goose, tern or another
// tool that applies SQL files can print the same SQL with [Migrator.Script]
// (or `idem migrate sql`) instead.
// The printed SQL records itself in idem_migrations too, so Version and Up
// keep working whichever tool applied it.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

//go:embed sql/*.sql
var files embed.FS

// citusLayout is idem's Citus layout for the latest version (see
// Config.Citus).
//
//go:embed citus/distribute.up.sql
var citusLayout string

// Direction says which way a migration runs.
type Direction string

const (
	// DirectionUp applies a migration.
	DirectionUp Direction = "up"
	// DirectionDown reverts a migration.
	DirectionDown Direction = "down"
)

// Migration is one numbered schema change. Its SQL holds the {{schema}}
// placeholder; [Migrator] substitutes the configured schema.
type Migration struct {
	Version int
	Name    string
	Up      string
	Down    string
}

// ErrUnknownVersion is returned when a version is asked for that no embedded
// migration has, including an Up or a Down on a database ahead of this
// binary.
var ErrUnknownVersion = errors.New("migrations: unknown version")

// ErrRefused is returned by Up and Down (and UpTx, DownTx) when a migration
// refuses to run in the state the database is in: applying or reverting it
// would change what a key in flight sends a provider (a different
// downstream idempotency key, a second charge) or make stored values
// unreadable. The error says what to do first; nothing was changed. The SQL
// raises SQLSTATE IDEM1 for it, whichever tool runs it.
var ErrRefused = errors.New("migrations: the migration refused to run")

// RefusedCode is the SQLSTATE a migration raises to refuse (ErrRefused).
const RefusedCode = "IDEM1"

// ErrUnreleasedSchema is returned by Up, Version and pgstore.New for a
// database that an unreleased development build of idem migrated (main's
// schema versions 7 to 11, between v0.1.0 and v0.2.0), whose version
// numbers this release uses for another schema. The error says what to do.
var ErrUnreleasedSchema = errors.New("migrations: the schema was migrated by an unreleased development build of idem")

// ErrInvalidSchema is returned by [New] for a schema name that is not a plain
// identifier.
var ErrInvalidSchema = errors.New("migrations: invalid schema name")

var all = mustLoad()

// All returns every embedded migration in version order.
func All() []Migration {
	return append([]Migration(nil), all...)
}

// Latest is the highest embedded version.
func Latest() int { return all[len(all)-1].Version }

var fileName = regexp.MustCompile(`^(\d{4})_([a-z0-9_]+)\.(up|down)\.sql$`)

func mustLoad() []Migration {
	entries, err := fs.ReadDir(files, "sql")
	if err != nil {
		panic(err)
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil {
			panic("migrations: unexpected file " + e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		body, err := files.ReadFile("sql/" + e.Name())
		if err != nil {
			panic(err)
		}
		mig := byVersion[v]
		if mig == nil {
			mig = &Migration{Version: v, Name: m[2]}
			byVersion[v] = mig
		}
		if m[3] == "up" {
			mig.Up = string(body)
		} else {
			mig.Down = string(body)
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.Up == "" || m.Down == "" {
			panic(fmt.Sprintf("migrations: version %d lacks an up or a down file", m.Version))
		}
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			panic(fmt.Sprintf("migrations: versions must be 1..n without gaps, found %d at position %d", m.Version, i+1))
		}
	}
	return out
}

// DB is what the migrator needs from a database handle; *pgxpool.Pool and
// *pgx.Conn satisfy it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Config configures a [Migrator].
type Config struct {
	// Schema is the Postgres schema that holds idem's tables. It must already
	// exist. Empty (the default) leaves table names unqualified, so they
	// resolve through the connection's search_path.
	Schema string

	// Citus makes Up, on a Citus coordinator, distribute idem's tables by
	// scope once every migration is applied, in the same transaction:
	// idem_keys and idem_leases become distributed tables co-located by
	// scope, the acquisition function a distributed function delegated by
	// its scope argument, and the notify trigger goes (stores poll on
	// Citus). A schema already distributed is left as it is. Down
	// refuses (ErrRefused) on a distributed schema. The Citus extension must
	// be installed in the database, and the schema created on the
	// coordinator (Citus propagates it). See docs/scaling.md, "Citus".
	// Default false: plain PostgreSQL, tables as the migrations create
	// them.
	Citus bool

	// LockTimeout bounds how long Up and Down wait for a lock on one of
	// idem's tables (lock_timeout, in their transaction). A migration that
	// alters a table asks for its ACCESS EXCLUSIVE lock, and while it waits
	// behind a long transaction every statement on that table queues behind
	// it: the application stalls. Past the timeout the migration gives up
	// with ErrLockTimeout, nothing applied, to be run again when the
	// transaction has ended. Default LockTimeoutDefault (10s); negative: no
	// limit (the server's own lock_timeout). UpTx and DownTx run in the
	// caller's transaction and leave its settings alone.
	LockTimeout time.Duration
}

// LockTimeoutDefault is Config.LockTimeout's default.
const LockTimeoutDefault = 10 * time.Second

// ErrLockTimeout is returned by Up and Down when a migration waited
// Config.LockTimeout for a lock another transaction holds on one of idem's
// tables.
var ErrLockTimeout = errors.New("migrations: gave up waiting for a table lock")

// Migrator applies and reverts the embedded migrations in one schema.
type Migrator struct {
	db     DB
	schema string
	prefix string // quoted schema and a dot, or empty
	citus  bool
	// lockTimeout is Config.LockTimeout with its default; <= 0: none.
	lockTimeout time.Duration
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}$`)

// QualifiedPrefix validates a schema name and returns the prefix that
// qualifies a table name with it ("" for the empty schema). pgstore uses it
// too, so both agree on what a valid schema is.
func QualifiedPrefix(schema string) (string, error) {
	if schema == "" {
		return "", nil
	}
	if !identifier.MatchString(schema) {
		return "", fmt.Errorf("%w: %q (letters, digits, _ and $, at most 63, not starting with a digit)", ErrInvalidSchema, schema)
	}
	return pgx.Identifier{schema}.Sanitize() + ".", nil
}

// New returns a Migrator. db may be nil when only [Migrator.Script] is used.
func New(db DB, cfg *Config) (*Migrator, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	prefix, err := QualifiedPrefix(cfg.Schema)
	if err != nil {
		return nil, err
	}
	lockTimeout := cfg.LockTimeout
	if lockTimeout == 0 {
		lockTimeout = LockTimeoutDefault
	}
	return &Migrator{db: db, schema: cfg.Schema, prefix: prefix, citus: cfg.Citus, lockTimeout: lockTimeout}, nil
}

func (m *Migrator) render(sql string) string {
	return strings.ReplaceAll(sql, "{{schema}}", m.prefix)
}

// bookkeepingSQL creates idem_migrations. (Development builds between
// v0.1.0 and v0.2.0 added a floor column to it; it is left as it is.)
func (m *Migrator) bookkeepingSQL() string {
	return m.render(`CREATE TABLE IF NOT EXISTS {{schema}}idem_migrations (
    version    int         PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);`)
}

// Result reports what Up or Down did.
type Result struct {
	// From and To are the schema versions before and after.
	From, To int
	// Applied lists the versions run, in the order they ran.
	Applied []int
	// Distributed says that this call distributed idem's tables by scope
	// (Config.Citus).
	Distributed bool
}

// Up applies every pending migration in one transaction. A database ahead
// of this binary is an error wrapping [ErrUnknownVersion]; one that an
// unreleased development build migrated, one wrapping [ErrUnreleasedSchema];
// a migration that refuses (keys in flight), one wrapping [ErrRefused].
func (m *Migrator) Up(ctx context.Context) (*Result, error) {
	return m.inTx(ctx, func(tx pgx.Tx) (*Result, error) { return m.UpTx(ctx, tx) })
}

// UpTx is Up inside the caller's transaction; nothing is committed until the
// caller commits, and the advisory lock is held until then.
func (m *Migrator) UpTx(ctx context.Context, tx pgx.Tx) (*Result, error) {
	return m.migrateTx(ctx, tx, Latest(), DirectionUp)
}

// Down reverts migrations down to version target (0 reverts everything).
// It refuses (ErrUnknownVersion) a database ahead of this binary: the
// versions it does not know are reverted by a binary that knows them.
func (m *Migrator) Down(ctx context.Context, target int) (*Result, error) {
	return m.inTx(ctx, func(tx pgx.Tx) (*Result, error) { return m.DownTx(ctx, tx, target) })
}

// DownTx is Down inside the caller's transaction.
func (m *Migrator) DownTx(ctx context.Context, tx pgx.Tx, target int) (*Result, error) {
	if target < 0 || target > Latest() {
		return nil, fmt.Errorf("%w: %d (this binary knows versions 1 to %d; a database ahead of it is reverted by a binary that knows its versions)", ErrUnknownVersion, target, Latest())
	}
	return m.migrateTx(ctx, tx, target, DirectionDown)
}

// Version reports the schema's current version (0 when nothing is applied).
func (m *Migrator) Version(ctx context.Context) (int, error) {
	tx, err := m.db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("migrations: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	return m.VersionTx(ctx, tx)
}

// VersionTx is Version inside the caller's transaction.
func (m *Migrator) VersionTx(ctx context.Context, tx pgx.Tx) (int, error) {
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, m.prefix+"idem_migrations").Scan(&exists); err != nil {
		return 0, fmt.Errorf("migrations: look for idem_migrations: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := tx.QueryRow(ctx, m.render(`SELECT coalesce(max(version), 0) FROM {{schema}}idem_migrations`)).Scan(&v); err != nil {
		return 0, fmt.Errorf("migrations: read version: %w", err)
	}
	if v <= unreleasedAfter {
		return v, nil
	}
	// Versions past v0.1.0's: this release's, or an unreleased build's of
	// the same numbers, told apart by the name of version 7.
	var name string
	if err := tx.QueryRow(ctx, m.render(`SELECT name FROM {{schema}}idem_migrations WHERE version = $1`), unreleasedAfter+1).Scan(&name); err != nil {
		return 0, fmt.Errorf("migrations: read version %d: %w", unreleasedAfter+1, err)
	}
	if name != all[unreleasedAfter].Name {
		return v, fmt.Errorf("%w: it is at version %d (version %d is %q; this release's is %q). v0.2 migrates from v0.1.0 (version %d) only: with the build that migrated it, drain its keys and run `idem migrate down --to %d`, or drop idem's tables if no key must be kept; then run `idem migrate up`",
			ErrUnreleasedSchema, v, unreleasedAfter+1, name, all[unreleasedAfter].Name, unreleasedAfter, unreleasedAfter)
	}
	return v, nil
}

// unreleasedAfter is v0.1.0's schema version: development builds of main
// numbered their unreleased migrations from the next one (see
// ErrUnreleasedSchema).
const unreleasedAfter = 6

func (m *Migrator) inTx(ctx context.Context, fn func(pgx.Tx) (*Result, error)) (*Result, error) {
	tx, err := m.db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrations: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// Read committed whatever the server's default: a migration that checks
	// for keys in flight after locking the tables must see the rows committed
	// while it waited for the lock, which a snapshot taken before the lock
	// (repeatable read, serializable) would hide.
	if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"); err != nil {
		return nil, fmt.Errorf("migrations: begin: %w", err)
	}
	if m.lockTimeout > 0 {
		if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", fmt.Sprintf("%dms", m.lockTimeout.Milliseconds())); err != nil {
			return nil, fmt.Errorf("migrations: begin: %w", err)
		}
	}
	res, err := fn(tx)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		return nil, fmt.Errorf("%w after %s: another transaction holds a lock on one of idem's tables (a long query or an open transaction); nothing was applied: run the migration again once it has ended: %w",
			ErrLockTimeout, m.lockTimeout, err)
	}
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("migrations: commit: %w", err)
	}
	return res, nil
}

func (m *Migrator) migrateTx(ctx context.Context, tx pgx.Tx, target int, dir Direction) (*Result, error) {
	// Serialise concurrent migrators of the same schema. The lock is
	// transaction-scoped, so a crashed migrator cannot leave it held.
	if _, err := tx.Exec(ctx,
		`SELECT pg_advisory_xact_lock(hashtextextended('idem.migrations.' || coalesce(nullif($1, ''), current_schema()), 0))`,
		m.schema); err != nil {
		return nil, fmt.Errorf("migrations: advisory lock: %w", err)
	}
	if _, err := tx.Exec(ctx, m.bookkeepingSQL()); err != nil {
		return nil, fmt.Errorf("migrations: create idem_migrations: %w", err)
	}
	from, err := m.VersionTx(ctx, tx)
	if err != nil {
		return nil, err
	}
	if from > Latest() {
		return nil, fmt.Errorf("%w: the database is at version %d, this binary knows up to %d: migrate it with a binary that knows its versions",
			ErrUnknownVersion, from, Latest())
	}
	// Whether the tables are distributed matters to a Citus Up and to a
	// Down; a plain Up does not ask.
	distributed := false
	if m.citus || dir == DirectionDown {
		if distributed, err = m.DistributedTx(ctx, tx); err != nil {
			return nil, err
		}
	}
	if distributed && dir == DirectionDown && target < from {
		return nil, fmt.Errorf("%w: idem's tables are distributed by Citus (migrations.Config.Citus); the down migrations are written for plain PostgreSQL: undistribute them first (undistribute_table) or drop the schema", ErrRefused)
	}
	res := &Result{From: from, To: from}
	for _, mig := range all {
		if mig.Version <= from || mig.Version > target {
			continue
		}
		if _, err := tx.Exec(ctx, m.render(mig.Up)); err != nil {
			if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == RefusedCode {
				return nil, fmt.Errorf("%w: %04d_%s: %s", ErrRefused, mig.Version, mig.Name, pgErr.Message)
			}
			return nil, fmt.Errorf("migrations: apply %04d_%s: %w", mig.Version, mig.Name, err)
		}
		if _, err := tx.Exec(ctx, m.render(`INSERT INTO {{schema}}idem_migrations (version, name) VALUES ($1, $2)`), mig.Version, mig.Name); err != nil {
			return nil, fmt.Errorf("migrations: record %04d: %w", mig.Version, err)
		}
		res.Applied = append(res.Applied, mig.Version)
		res.To = mig.Version
	}
	if m.citus && dir == DirectionUp && !distributed {
		if err := m.distribute(ctx, tx, res.To); err != nil {
			return nil, err
		}
		res.Distributed = true
	}
	for i := len(all) - 1; i >= 0; i-- {
		mig := all[i]
		if mig.Version > from || mig.Version <= target {
			continue
		}
		if _, err := tx.Exec(ctx, m.render(mig.Down)); err != nil {
			if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == RefusedCode {
				return nil, fmt.Errorf("%w: %04d_%s: %s", ErrRefused, mig.Version, mig.Name, pgErr.Message)
			}
			return nil, fmt.Errorf("migrations: revert %04d_%s: %w", mig.Version, mig.Name, err)
		}
		if _, err := tx.Exec(ctx, m.render(`DELETE FROM {{schema}}idem_migrations WHERE version = $1`), mig.Version); err != nil {
			return nil, fmt.Errorf("migrations: unrecord %04d: %w", mig.Version, err)
		}
		res.Applied = append(res.Applied, mig.Version)
		res.To = mig.Version - 1
	}
	if target == 0 && from > 0 {
		// Nothing of idem is left: its bookkeeping table goes too.
		if _, err := tx.Exec(ctx, m.render(`DROP TABLE IF EXISTS {{schema}}idem_migrations`)); err != nil {
			return nil, fmt.Errorf("migrations: drop idem_migrations: %w", err)
		}
	}
	return res, nil
}

// Files returns the migrations as one file per version in format, keyed by
// file name, for tools that keep a directory of migrations (goose, tern):
// "00001_idem_idem_keys.sql" and so on for goose, "001_idem_idem_keys.sql"
// for tern, and an .up.sql and a .down.sql per version for plain SQL. Each
// file holds exactly one version, so a later version is a new file. For a
// directory that holds migrations already (yours, or idem's earlier
// versions), [Migrator.FilesFor] names the missing ones to follow them.
func (m *Migrator) Files(format Format) (map[string]string, error) {
	files := map[string]string{}
	for _, mig := range all {
		switch format {
		case FormatGoose, FormatTern:
			script, err := m.Script(format, DirectionUp, mig.Version)
			if err != nil {
				return nil, err
			}
			pattern := "%05d_idem_%s.sql"
			if format == FormatTern {
				pattern = "%03d_idem_%s.sql"
			}
			files[fmt.Sprintf(pattern, mig.Version, mig.Name)] = script
		case FormatSQL, "":
			for _, dir := range []Direction{DirectionUp, DirectionDown} {
				script, err := m.Script(FormatSQL, dir, mig.Version)
				if err != nil {
					return nil, err
				}
				files[fmt.Sprintf("%04d_idem_%s.%s.sql", mig.Version, mig.Name, dir)] = script
			}
		default:
			return nil, fmt.Errorf("migrations: unknown format %q (sql, goose or tern)", format)
		}
	}
	return files, nil
}

// FilesFor is [Migrator.Files] for a directory that already holds the files
// named in existing: it returns only the versions missing there, named to
// follow them. For goose and tern, whose migrations are one numbered
// sequence, a version is there when a file "<number>_idem_<name>.sql" is,
// whatever its number (a team may have renumbered it), and the missing ones
// are numbered after the highest number of any file in the directory, the
// application's own migrations included, so the sequence has no duplicate
// and no gap (tern refuses either). For plain SQL, files are matched by
// name.
func (m *Migrator) FilesFor(format Format, existing []string) (map[string]string, error) {
	files, err := m.Files(format)
	if err != nil {
		return nil, err
	}
	if format != FormatGoose && format != FormatTern {
		for _, name := range existing {
			delete(files, name)
		}
		return files, nil
	}
	present, highest := map[string]bool{}, 0
	for _, name := range existing {
		num, rest, ok := strings.Cut(name, "_")
		n, err := strconv.Atoi(num)
		if !ok || err != nil || !strings.HasSuffix(name, ".sql") {
			continue
		}
		highest = max(highest, n)
		present[rest] = true
	}
	width := 5
	if format == FormatTern {
		width = 3
	}
	out := map[string]string{}
	for _, mig := range all {
		suffix := fmt.Sprintf("idem_%s.sql", mig.Name)
		if present[suffix] {
			continue
		}
		highest++
		out[fmt.Sprintf("%0*d_%s", width, highest, suffix)] = files[fmt.Sprintf("%0*d_%s", width, mig.Version, suffix)]
	}
	return out, nil
}

// Format selects the layout of [Migrator.Script].
type Format string

const (
	// FormatSQL is plain SQL, one section per version, for psql or a tool
	// that applies SQL files as they are.
	FormatSQL Format = "sql"
	// FormatGoose wraps each version in goose's -- +goose Up/Down annotations.
	FormatGoose Format = "goose"
	// FormatTern separates up and down with tern's marker line.
	FormatTern Format = "tern"
)

// Script returns the SQL of one migration (version > 0) or of all of them
// (version 0), rendered for the configured schema, for teams that apply
// migrations with their own tool. Each version's SQL also records itself in
// idem_migrations, so [Migrator.Version] stays truthful. Apply each version
// in one transaction: in plain SQL each is wrapped in BEGIN and COMMIT (psql
// applies it whole or not at all); goose and tern run each file in one
// transaction themselves, as their files here say.
func (m *Migrator) Script(format Format, dir Direction, version int) (string, error) {
	var picked []Migration
	for _, mig := range all {
		if version == 0 || mig.Version == version {
			picked = append(picked, mig)
		}
	}
	if len(picked) == 0 {
		return "", fmt.Errorf("%w: %d", ErrUnknownVersion, version)
	}
	up := func(mig Migration) string {
		return fmt.Sprintf("%s\n\n%s\n%s\n", m.bookkeepingSQL(), strings.TrimSpace(m.render(mig.Up)),
			m.render(fmt.Sprintf("INSERT INTO {{schema}}idem_migrations (version, name) VALUES (%d, '%s') ON CONFLICT (version) DO NOTHING;", mig.Version, mig.Name)))
	}
	down := func(mig Migration) string {
		bookkeeping := fmt.Sprintf("DELETE FROM {{schema}}idem_migrations WHERE version = %d;", mig.Version)
		if mig.Version == 1 {
			// Reverting the first version leaves nothing of idem behind.
			bookkeeping = "DROP TABLE IF EXISTS {{schema}}idem_migrations;"
		}
		return fmt.Sprintf("%s\n%s\n", strings.TrimSpace(m.render(mig.Down)), m.render(bookkeeping))
	}
	var b strings.Builder
	switch format {
	case FormatSQL, "":
		// Each version in a transaction of its own: a version applied in
		// part (psql stopping at an error) would leave a schema no version
		// describes.
		if dir == DirectionDown {
			for i := len(picked) - 1; i >= 0; i-- {
				fmt.Fprintf(&b, "-- idem migration %04d_%s (down)\nBEGIN;\n%sCOMMIT;\n\n", picked[i].Version, picked[i].Name, down(picked[i]))
			}
		} else if dir == DirectionUp || dir == "" {
			for _, mig := range picked {
				fmt.Fprintf(&b, "-- idem migration %04d_%s (up)\nBEGIN;\n%s\nCOMMIT;\n\n", mig.Version, mig.Name, up(mig))
			}
		} else {
			return "", fmt.Errorf("migrations: unknown direction %q", dir)
		}
	case FormatGoose:
		for _, mig := range picked {
			fmt.Fprintf(&b, "-- idem migration %04d_%s\n-- goose applies each direction in one transaction: keep it so (no NO TRANSACTION).\n-- +goose Up\n-- +goose StatementBegin\n%s-- +goose StatementEnd\n\n-- +goose Down\n-- +goose StatementBegin\n%s-- +goose StatementEnd\n",
				mig.Version, mig.Name, up(mig), down(mig))
		}
	case FormatTern:
		for _, mig := range picked {
			fmt.Fprintf(&b, "-- idem migration %04d_%s\n-- tern applies each migration in one transaction: keep it so.\n%s\n---- create above / drop below ----\n\n%s", mig.Version, mig.Name, up(mig), down(mig))
		}
	default:
		return "", fmt.Errorf("migrations: unknown format %q (sql, goose or tern)", format)
	}
	return b.String(), nil
}

// ErrNotCitus is returned by Up with Config.Citus on a database without the
// citus extension.
var ErrNotCitus = errors.New("migrations: the citus extension is not installed in this database")

// Distributed reports whether idem's keys table is distributed by Citus
// (the layout of Config.Citus was applied).
func (m *Migrator) Distributed(ctx context.Context) (bool, error) {
	tx, err := m.db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("migrations: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	return m.DistributedTx(ctx, tx)
}

// DistributedTx is Distributed inside the caller's transaction.
func (m *Migrator) DistributedTx(ctx context.Context, tx pgx.Tx) (bool, error) {
	citus, err := hasCitus(ctx, tx)
	if err != nil || !citus {
		return false, err
	}
	var distributed bool
	// pg_dist_partition is named only once the extension is known to be
	// there: on plain PostgreSQL it does not exist.
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass($1))`,
		m.prefix+"idem_keys").Scan(&distributed); err != nil {
		return false, fmt.Errorf("migrations: look at pg_dist_partition: %w", err)
	}
	return distributed, nil
}

// distribute applies the Citus layout to a schema at version.
func (m *Migrator) distribute(ctx context.Context, tx pgx.Tx, version int) error {
	citus, err := hasCitus(ctx, tx)
	if err != nil {
		return err
	}
	if !citus {
		return fmt.Errorf("%w: install it (CREATE EXTENSION citus) on the coordinator and the workers, or migrate without Citus", ErrNotCitus)
	}
	if version != Latest() {
		return fmt.Errorf("migrations: the Citus layout is written for schema version %d, and the schema is at %d", Latest(), version)
	}
	var searchPath string
	if err := tx.QueryRow(ctx, `SELECT current_setting('search_path')`).Scan(&searchPath); err != nil {
		return fmt.Errorf("migrations: read search_path: %w", err)
	}
	layout := strings.ReplaceAll(m.render(citusLayout), "{{search_path}}", searchPath)
	for _, step := range strings.Split(layout, "\n-- idem:step\n") {
		if _, err := tx.Exec(ctx, step); err != nil {
			return fmt.Errorf("migrations: distribute idem's tables by scope (Citus): %w", err)
		}
	}
	return nil
}

// hasCitus reports whether the citus extension is installed in the
// database.
func hasCitus(ctx context.Context, tx pgx.Tx) (bool, error) {
	var citus bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&citus); err != nil {
		return false, fmt.Errorf("migrations: look for the citus extension: %w", err)
	}
	return citus, nil
}
