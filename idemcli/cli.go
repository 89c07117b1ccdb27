package idemcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/migrations"
	"github.com/go-idem/idem/pgstore"
)

// Exit codes. Scripts can rely on them.
const (
	// ExitOK: the command did what was asked.
	ExitOK = 0
	// ExitFailure: the command failed (the database, a migration), or it
	// ran but left work undone that needs attention: a key the completer
	// could not finish, a key reconcile could not resolve.
	ExitFailure = 1
	// ExitUsage: the command line was wrong (unknown command or flag, a
	// missing argument, a bad value, DATABASE_URL unset). Nothing ran.
	ExitUsage = 2
	// ExitNotFound: the key named on the command line does not exist.
	ExitNotFound = 3
	// ExitNoFlows: the command runs the application's flows (complete,
	// reconcile) and this binary has none registered; build one with
	// idemcli and the application's flows.
	ExitNoFlows = 4
)

// Config configures the CLI. The zero value is the generic tool.
type Config struct {
	// Name is the program name used in help, examples and messages.
	// Default: for Main, the base name of os.Args[0]; for Dispatch, "idem".
	Name string

	// Flows are the application's flows. complete and reconcile run them;
	// without flows those commands exit with ExitNoFlows.
	Flows []idem.AnyFlow

	// Runner is the base configuration of the runner the commands use
	// (Lease, Retention, Observer...). Flows are added to it. Its Logger,
	// if set, replaces the CLI's (text on stderr, warnings and up, info
	// with -v).
	Runner *idem.Config

	// Keyring is the application's keyring (pgstore.Config.Keyring), when it
	// seals keys at rest: complete and reconcile need it to read the input
	// stored with a key, and `keys show --reveal` to show it. Without it,
	// a sealed key's payload cannot be revealed, and the commands say so.
	Keyring *idemtype.Keyring

	// Stdout and Stderr default to the process's.
	Stdout, Stderr io.Writer

	// Getenv reads DATABASE_URL. Default os.Getenv.
	Getenv func(string) string
}

func (c *Config) withDefaults() *Config {
	out := &Config{}
	if c != nil {
		*out = *c
	}
	if out.Name == "" {
		out.Name = "idem"
	}
	if out.Stdout == nil {
		out.Stdout = os.Stdout
	}
	if out.Stderr == nil {
		out.Stderr = os.Stderr
	}
	if out.Getenv == nil {
		out.Getenv = os.Getenv
	}
	return out
}

// Main runs the CLI on the process's arguments and exits with its code.
// SIGINT and SIGTERM cancel the running command, which stops cleanly (a
// request being completed is rolled back and released). Without a
// Config.Name, the program's name is the base name it was run by
// (os.Args[0]), so help, examples and messages show the command the
// operator typed.
func Main(config *Config) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	cfg := Config{}
	if config != nil {
		cfg = *config
	}
	if cfg.Name == "" && len(os.Args) > 0 {
		cfg.Name = filepath.Base(os.Args[0])
	}
	code := Dispatch(ctx, os.Args[1:], &cfg)
	stop()
	os.Exit(code)
}

// Dispatch runs the command in args (without the program name) and returns its
// exit code.
func Dispatch(ctx context.Context, args []string, config *Config) int {
	cfg := config.withDefaults()
	e := &env{cfg: cfg, out: cfg.Stdout, errOut: cfg.Stderr}
	err := e.run(ctx, args)
	if err == nil {
		return ExitOK
	}
	var ee *exitError
	if !errors.As(err, &ee) {
		ee = &exitError{code: exitCodeOf(err), err: err}
	}
	if ee.err != nil {
		// Errors may quote text from the database (a key, a stored error).
		fmt.Fprintf(e.errOut, "%s: %s\n", cfg.Name, sanitize(ee.err.Error()))
	}
	if ee.code == ExitUsage && ee.hint != "" {
		fmt.Fprintf(e.errOut, "Run '%s help %s' for usage.\n", cfg.Name, ee.hint)
	}
	return ee.code
}

// exitError carries an exit code with the error to print (nil prints
// nothing: the command already said what happened).
type exitError struct {
	code int
	err  error
	// hint names the command whose help a usage error points to.
	hint string
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

func exitCodeOf(err error) int {
	switch {
	case errors.Is(err, idem.ErrNotFound):
		return ExitNotFound
	case errors.Is(err, idem.ErrInvalidRequest):
		return ExitUsage
	}
	return ExitFailure
}

func usageError(cmd *command, format string, args ...any) error {
	hint := ""
	if cmd != nil {
		hint = cmd.name
	}
	return &exitError{code: ExitUsage, err: fmt.Errorf(format, args...), hint: hint}
}

// env is one invocation: its configuration, global flags, and the database
// handles, opened on first use.
type env struct {
	cfg         *Config
	out, errOut io.Writer

	schema  string
	json    bool
	verbose bool
	// citus is migrate up's --citus: distribute idem's tables by scope.
	citus bool
	// lockTimeout is migrate's --lock-timeout.
	lockTimeout time.Duration

	// cmd is the command being run.
	cmd *command

	pool   *pgxpool.Pool
	runner *idem.Runner
	// abandonAfter, when set, overrides the runner's UnfinishedRetention (reap).
	abandonAfter time.Duration
}

// globalFlags registers the flags every command accepts.
func (e *env) globalFlags(fs *flag.FlagSet) {
	fs.StringVar(&e.schema, "schema", e.schema, "`schema` holding idem's tables (default: the connection's search_path)")
	fs.BoolVar(&e.json, "json", e.json, "print JSON instead of a table")
	fs.BoolVar(&e.verbose, "v", e.verbose, "log progress (info level) to stderr")
}

func (e *env) run(ctx context.Context, args []string) error {
	top := flag.NewFlagSet(e.cfg.Name, flag.ContinueOnError)
	top.SetOutput(io.Discard)
	e.globalFlags(top)
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			e.printOverview(e.out)
			return nil
		}
		return usageError(nil, "%v", err)
	}
	args = top.Args()
	if len(args) == 0 {
		e.printOverview(e.errOut)
		return &exitError{code: ExitUsage}
	}
	if args[0] == "help" {
		return e.help(args[1:])
	}
	cmd, rest, err := lookup(args)
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet(e.cfg.Name+" "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	e.globalFlags(fs)
	e.cmd = cmd
	runCmd := cmd.setup(fs)
	positional, err := parseInterspersed(fs, rest)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			e.printCommandHelp(cmd)
			return nil
		}
		return usageError(cmd, "%s: %v", cmd.name, err)
	}
	if len(positional) < cmd.minArgs || len(positional) > cmd.maxArgs {
		return usageError(cmd, "%s: usage: %s %s", cmd.name, e.cfg.Name, cmd.name+" "+cmd.args)
	}
	if len(positional) == 1 && fs.Lookup("scope") != nil && fs.Lookup("scope").Value.String() == "" {
		// A key means nothing without its scope: the same key in two
		// scopes is two requests.
		return usageError(cmd, "%s: --scope is required with KEY", cmd.name)
	}
	if cmd.needsFlows && len(e.cfg.Flows) == 0 {
		return &exitError{code: ExitNoFlows, err: fmt.Errorf("%s: this binary has no flows registered, and %s runs the application's phases and reconcile hooks; "+
			"build your application's own CLI with the idemcli package and its flows (see docs/operations.md)", cmd.name, cmd.name)}
	}
	defer func() {
		if e.pool != nil {
			e.pool.Close()
		}
	}()
	return runCmd(ctx, e, positional)
}

// lookup finds the command named by the first one or two arguments.
func lookup(args []string) (*command, []string, error) {
	if len(args) > 1 {
		if cmd, ok := commandsByName[args[0]+" "+args[1]]; ok {
			return cmd, args[2:], nil
		}
	}
	if cmd, ok := commandsByName[args[0]]; ok {
		return cmd, args[1:], nil
	}
	if subs := subcommandsOf(args[0]); len(subs) > 0 {
		if len(args) > 1 && !strings.HasPrefix(args[1], "-") {
			return nil, nil, usageError(nil, "unknown command %q (%s takes %s)", args[0]+" "+args[1], args[0], strings.Join(subs, ", "))
		}
		return nil, nil, &exitError{code: ExitUsage, err: fmt.Errorf("%s needs a subcommand: %s", args[0], strings.Join(subs, ", ")), hint: args[0]}
	}
	return nil, nil, usageError(nil, "unknown command %q", args[0])
}

// connect opens the pool and the runner. Commands call it after checking
// their flags, so a bad command line fails before any connection is made.
// The store's control statements (marks, heartbeats) share the pool
// (ControlDB) rather than open one of their own: the CLI completes and
// reconciles one key at a time, which holds at most two connections (its
// phase and a mark or heartbeat), so the pool's four never run out.
func (e *env) connect(ctx context.Context) error {
	if err := e.connectPool(ctx); err != nil {
		return err
	}
	pool := e.pool
	store, err := pgstore.New(pool, &pgstore.Config{Schema: e.schema, ControlDB: pool, Keyring: e.cfg.Keyring})
	if err != nil {
		pool.Close()
		return &exitError{code: ExitUsage, err: err}
	}
	rcfg := &idem.Config{}
	if e.cfg.Runner != nil {
		*rcfg = *e.cfg.Runner
	}
	rcfg.Flows = append(append([]idem.AnyFlow(nil), rcfg.Flows...), e.cfg.Flows...)
	if e.abandonAfter != 0 {
		rcfg.UnfinishedRetention = e.abandonAfter
		if e.abandonAfter > 0 {
			// Over every flow's own setting: an operator's explicit age.
			rcfg.Flows = nil
		}
	}
	if rcfg.Logger == nil {
		level := slog.LevelWarn
		if e.verbose {
			level = slog.LevelInfo
		}
		rcfg.Logger = slog.New(slog.NewTextHandler(e.errOut, &slog.HandlerOptions{Level: level}))
	}
	runner, err := idem.NewRunner(store, rcfg)
	if err != nil {
		pool.Close()
		return err
	}
	e.runner = runner
	return nil
}

// connectPool opens the pool alone: the migrate commands need no store, whose
// construction checks that the schema is migrated.
func (e *env) connectPool(ctx context.Context) error {
	url := e.cfg.Getenv("DATABASE_URL")
	if url == "" {
		return &exitError{code: ExitUsage, err: errors.New("DATABASE_URL is not set; export it, e.g. DATABASE_URL=postgres://user@host:5432/db")}
	}
	if _, err := migrations.QualifiedPrefix(e.schema); err != nil {
		return &exitError{code: ExitUsage, err: fmt.Errorf("--schema: %w", err)}
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return &exitError{code: ExitUsage, err: fmt.Errorf("DATABASE_URL: %w", err)}
	}
	pcfg.MaxConns = 4
	if !strings.Contains(url, "default_query_exec_mode") {
		// A command runs a handful of statements: caching prepared
		// statements saves it nothing, and a pooler in transaction mode
		// (PgBouncer) breaks them. exec works everywhere.
		pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	e.pool = pool
	return nil
}

func (e *env) migrator() (*migrations.Migrator, error) {
	var db migrations.DB
	if e.pool != nil {
		db = e.pool
	}
	m, err := migrations.New(db, &migrations.Config{Schema: e.schema, Citus: e.citus, LockTimeout: e.lockTimeout})
	if err != nil {
		return nil, &exitError{code: ExitUsage, err: fmt.Errorf("--schema: %w", err)}
	}
	return m, nil
}

// connectedMigrator connects and returns the migrator on that connection.
func (e *env) connectedMigrator(ctx context.Context) (*migrations.Migrator, error) {
	if err := e.connectPool(ctx); err != nil {
		return nil, err
	}
	return e.migrator()
}
