package idemcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/migrations"
)

// command is one CLI command. setup registers its flags on fs and returns
// the function that runs it with their parsed values.
type command struct {
	name    string // "keys list"
	args    string // what follows the name in the usage line
	summary string
	help    string
	// examples are command lines with PROG for the program's name
	// (Config.Name), so an application's CLI shows its own.
	examples []string

	minArgs, maxArgs int
	needsDB          bool
	needsFlows       bool
	setup            func(fs *flag.FlagSet) runFunc
}

type runFunc func(ctx context.Context, e *env, args []string) error

// commands in the order help lists them.
var commands = []*command{
	{
		name: "migrate up", args: "[flags]", needsDB: true,
		summary: "apply every pending migration",
		help: "Applies the embedded migrations the database does not have yet, in one transaction, under an\n" +
			"advisory lock (several processes migrating at once is safe). A no-op when up to date.\n" +
			"With --citus, on a Citus coordinator, it then distributes idem's tables by scope, in the same\n" +
			"transaction (once; see docs/scaling.md, \"Citus\").",
		examples: []string{"DATABASE_URL=postgres://app@db/app PROG migrate up", "PROG migrate up --schema idem",
			"PROG migrate up --citus   # on a Citus coordinator"},
		setup: func(fs *flag.FlagSet) runFunc {
			citus := fs.Bool("citus", false, "distribute idem's tables by scope on a Citus coordinator (the citus extension must be installed)")
			lockTimeout := lockTimeoutFlag(fs)
			return func(ctx context.Context, e *env, _ []string) error {
				e.citus, e.lockTimeout = *citus, *lockTimeout
				m, err := e.connectedMigrator(ctx)
				if err != nil {
					return err
				}
				res, err := m.Up(ctx)
				if err != nil {
					return err
				}
				return e.printMigration(res)
			}
		},
	},
	{
		name: "migrate down", args: "[--to VERSION] [--yes] [flags]", needsDB: true,
		summary: "revert migrations (one by default)",
		help: "Reverts the most recent migration, or every migration above --to. Reverting version 1 drops\n" +
			"idem_keys and every key in it: in-flight requests lose their recovery points, finished ones\n" +
			"their stored responses. Going below version 1 therefore needs --yes.",
		examples: []string{"PROG migrate down", "PROG migrate down --to 0 --yes   # remove idem's tables and every key"},
		setup: func(fs *flag.FlagSet) runFunc {
			to := fs.Int("to", -1, "revert down to `version` (default: one below the current)")
			yes := fs.Bool("yes", false, "confirm going below version 1, which drops idem_keys and every key in it")
			lockTimeout := lockTimeoutFlag(fs)
			return func(ctx context.Context, e *env, _ []string) error {
				e.lockTimeout = *lockTimeout
				m, err := e.connectedMigrator(ctx)
				if err != nil {
					return err
				}
				target := *to
				if target < 0 {
					v, err := m.Version(ctx)
					if err != nil {
						return err
					}
					target = max(v-1, 0)
				}
				if target < 1 && !*yes {
					v, err := m.Version(ctx)
					if err != nil {
						return err
					}
					if v >= 1 {
						return usageError(e.cmd, "migrate down: reverting version 1 drops idem_keys and every key in it; "+
							"pass --yes if that is what you want")
					}
				}
				res, err := m.Down(ctx, target)
				if errors.Is(err, migrations.ErrUnknownVersion) {
					return &exitError{code: ExitUsage, err: err, hint: "migrate down"}
				}
				if err != nil {
					return err
				}
				return e.printMigration(res)
			}
		},
	},
	{
		name: "migrate status", args: "[flags]", needsDB: true,
		summary:  "show the schema version and pending migrations",
		examples: []string{"PROG migrate status", "PROG migrate status --json | jq .pending"},
		setup: func(fs *flag.FlagSet) runFunc {
			return func(ctx context.Context, e *env, _ []string) error {
				m, err := e.connectedMigrator(ctx)
				if err != nil {
					return err
				}
				v, err := m.Version(ctx)
				if err != nil {
					return err
				}
				return e.printMigrationStatus(v)
			}
		},
	},
	{
		name: "migrate sql", args: "[--format sql|goose|tern] [--direction up|down] [--version N] [--out-dir DIR]",
		summary: "print the migrations' SQL for another migration tool",
		help: "Prints the SQL of every migration (or of --version) for teams that apply migrations with their\n" +
			"own tool. The SQL records itself in idem_migrations, so `migrate status` and `migrate up` keep\n" +
			"working whichever tool applied it. Needs no database.\n" +
			"With --out-dir, writes one file per version into DIR instead (goose: 00001_idem_idem_keys.sql,\n" +
			"tern: 001_idem_idem_keys.sql, sql: an .up.sql and a .down.sql each), leaving idem's files that\n" +
			"are already there alone: after upgrading idem, run it again and your tool applies the new files.\n" +
			"For goose and tern, DIR may hold your own migrations: idem's files are numbered after the\n" +
			"highest number there, and recognised by their name (NNN_idem_NAME.sql) whatever their number.",
		examples: []string{
			"PROG migrate sql --format goose --out-dir migrations",
			"PROG migrate sql > 0001_idem.sql",
			"PROG migrate sql --direction down --version 1",
		},
		setup: func(fs *flag.FlagSet) runFunc {
			format := fs.String("format", "sql", "`layout`: sql (plain), goose or tern")
			direction := fs.String("direction", "up", "`up` or down (sql format only; goose and tern hold both)")
			version := fs.Int("version", 0, "print only this `version` (default: all)")
			outDir := fs.String("out-dir", "", "write one file per version into `dir` instead of printing")
			return func(ctx context.Context, e *env, _ []string) error {
				m, err := e.migrator()
				if err != nil {
					return err
				}
				if *outDir != "" {
					return e.writeMigrationFiles(m, migrations.Format(*format), *outDir)
				}
				script, err := m.Script(migrations.Format(*format), migrations.Direction(*direction), *version)
				if err != nil {
					return &exitError{code: ExitUsage, err: err, hint: "migrate sql"}
				}
				if e.json {
					return e.printJSON(map[string]any{"format": *format, "direction": *direction, "version": *version, "sql": script})
				}
				_, err = fmt.Fprint(e.out, script)
				return err
			}
		},
	},
	{
		name: "keys list", args: "--scope SCOPE | --all-scopes [--state STATE] [--flow FLOW] [--limit N] [--reveal] [flags]", needsDB: true,
		summary: "list keys, newest first, by state, scope or flow",
		help: "States:\n" +
			"  running          unfinished, held by a live lease: a worker is on it\n" +
			"  stale            unfinished, nobody holds it: the next retry or the completer resumes it\n" +
			"  needs_reconcile  a not-idempotent call is in doubt: waits for a reconcile run\n" +
			"  finished         response stored, replayed until it expires\n" +
			"  expired          finished and past its expiry: not replayed; a reuse of the key runs anew\n" +
			"Scopes are tenants: name one with --scope, or list every tenant's keys with --all-scopes.\n" +
			"Keys are listed with their metadata; --reveal adds their params, checkpoint data and stored\n" +
			"response (which may hold personal or payment data). Page backwards with --before-id set to the\n" +
			"last id printed.",
		examples: []string{
			"PROG keys list --all-scopes --state stale",
			"PROG keys list --all-scopes --state needs_reconcile --flow rides.create --json | jq -r '.keys[].key'",
			"PROG keys list --scope user:42 --limit 10",
		},
		setup: func(fs *flag.FlagSet) runFunc {
			state := fs.String("state", "", "only keys in `state`: running, stale, needs_reconcile, finished or expired")
			scope := fs.String("scope", "", "only keys of `scope` (this or --all-scopes is required)")
			allScopes := fs.Bool("all-scopes", false, "list the keys of every scope (tenant)")
			flow := fs.String("flow", "", "only keys of `flow`")
			limit := fs.Int("limit", 50, fmt.Sprintf("print at most `n` keys (1-%d)", idemtype.MaxKeyListLimit))
			before := fs.Int64("before-id", 0, "only keys with an id below `id` (paging)")
			reveal := fs.Bool("reveal", false, "with --json, include each key's params, checkpoint data and stored response")
			return func(ctx context.Context, e *env, _ []string) error {
				q := idemtype.KeyQuery{Scope: *scope, AllScopes: *allScopes, Flow: *flow, Limit: *limit, BeforeID: *before, Reveal: *reveal}
				if *state != "" {
					st, err := idemtype.ParseKeyState(*state)
					if err != nil {
						return usageError(e.cmd, "--state: %v", err)
					}
					q.State = st
				}
				if *limit < 1 || *limit > idemtype.MaxKeyListLimit {
					return usageError(e.cmd, "--limit %d is outside 1-%d", *limit, idemtype.MaxKeyListLimit)
				}
				switch {
				case *scope == "" && !*allScopes:
					return usageError(e.cmd, "keys list: name a --scope, or list every tenant's keys with --all-scopes")
				case *scope != "" && *allScopes:
					return usageError(e.cmd, "keys list: --scope and --all-scopes exclude each other")
				}
				if err := e.connect(ctx); err != nil {
					return err
				}
				// One key more than the page tells whether older ones exist.
				if q.Limit < idemtype.MaxKeyListLimit {
					q.Limit++
				}
				list, err := e.runner.ListKeys(ctx, q)
				if err != nil {
					return err
				}
				more := len(list.Keys) >= q.Limit
				if len(list.Keys) > *limit {
					list.Keys = list.Keys[:*limit]
				}
				return e.printKeyList(list, *reveal, more)
			}
		},
	},
	{
		name: "keys show", args: "KEY --scope SCOPE | --id ID [--reveal] [flags]", maxArgs: 1, needsDB: true,
		summary: "show one key: its state, progress and lease",
		help: "Prints the key's state, progress, lease, attempts and last error, and every operator verdict given\n" +
			"on it (keys resolve), kept after the key itself is gone. --reveal adds its params, checkpoint data,\n" +
			"stored response and fingerprints, which may hold or betray personal or payment data. Name the key\n" +
			"by its scope and key, or by its row id with --id: the key_id of log lines, the ID column of keys list.",
		examples: []string{
			"PROG keys show 8d3c1a7e-5b7f-4f0e-9d51-3f1c2b6f9a10 --scope user:42",
			"PROG keys show --id 1234",
			"PROG keys show order-77 --scope tenant:acme --reveal --json | jq .checkpoint",
		},
		setup: func(fs *flag.FlagSet) runFunc {
			scope := fs.String("scope", "", "the key's `scope` (required with KEY)")
			id := fs.Int64("id", 0, "the key's row `id` (key_id in logs), instead of KEY and --scope")
			reveal := fs.Bool("reveal", false, "include the key's params, checkpoint data and stored response")
			return func(ctx context.Context, e *env, args []string) error {
				q := idemtype.KeyQuery{Limit: 1, Reveal: *reveal}
				switch {
				case *id < 0:
					return usageError(e.cmd, "keys show: --id %d is not a key's id", *id)
				case *id > 0 && (len(args) > 0 || *scope != ""):
					return usageError(e.cmd, "keys show: name the key by KEY and --scope, or by --id, not both")
				case *id > 0:
					q.AllScopes, q.ID = true, *id
				case len(args) == 0:
					return usageError(e.cmd, "%s: usage: %s %s %s", e.cmd.name, e.cfg.Name, e.cmd.name, e.cmd.args)
				default:
					q.Scope, q.Key = *scope, args[0]
				}
				if err := e.connect(ctx); err != nil {
					return err
				}
				list, err := e.runner.ListKeys(ctx, q)
				if err != nil {
					return err
				}
				if len(list.Keys) == 0 && q.ID > 0 {
					return fmt.Errorf("%w: no key has id %d", idem.ErrNotFound, q.ID)
				}
				if len(list.Keys) > 0 {
					q.Scope, q.Key = list.Keys[0].Scope, list.Keys[0].Key
				}
				verdicts, err := e.runner.Verdicts(ctx, q.Scope, q.Key)
				if err != nil {
					return err
				}
				if len(list.Keys) == 0 {
					// The verdicts outlive the key: show them anyway.
					if err := e.printVerdictsOfMissingKey(verdicts); err != nil {
						return err
					}
					return fmt.Errorf("%w: scope %q key %q", idem.ErrNotFound, *scope, args[0])
				}
				return e.printKey(list.Keys[0], list.Now, *reveal, verdicts)
			}
		},
	},
	{
		name: "keys unlock", args: "KEY --scope SCOPE [--reason TEXT] [flags]", minArgs: 1, maxArgs: 1, needsDB: true,
		summary: "force-unlock a stuck key (moves its fence on)",
		help: "Unlocks an unfinished key and moves its fencing token on, so the worker that held it, if it is\n" +
			"still alive, can no longer commit a phase: its next commit fails with lock-lost and rolls back.\n" +
			"The key keeps its recovery point; the next client retry (or the completer) resumes it. Use it\n" +
			"for a key held by a wedged worker whose heartbeat keeps its lease alive. A finished key is left\n" +
			"as it is (exit 0, nothing to unlock).",
		examples: []string{
			"PROG keys unlock order-77 --scope tenant:acme --reason 'worker pod wedged, INC-1234'",
		},
		setup: func(fs *flag.FlagSet) runFunc {
			scope := fs.String("scope", "", "the key's `scope` (required)")
			reason := fs.String("reason", "unlocked by an operator with the idem CLI", "`text` recorded as the key's last error")
			return func(ctx context.Context, e *env, args []string) error {
				if err := e.connect(ctx); err != nil {
					return err
				}
				res, err := e.runner.UnlockKey(ctx, *scope, args[0], *reason)
				if err != nil {
					return err
				}
				return e.printUnlock(res)
			}
		},
	},
	{
		name: "keys resolve", args: "KEY --scope SCOPE --verdict happened|not-happened|abandon --operator NAME --reason TEXT [--status N --body @FILE] [--confirm] [--dry-run] [flags]",
		minArgs: 1, maxArgs: 1, needsDB: true,
		summary: "give an operator's verdict on a needs_reconcile key",
		help: "For a key in needs_reconcile whose reconcile hook keeps answering unknown, or that has no hook: you\n" +
			"found out from the provider what its call in doubt did.\n" +
			"  happened      the call took effect: the phase is committed in its stead and the key resumes at the\n" +
			"                next phase on its client's retry or the completer's next pass. With --status (and\n" +
			"                --body), the key is finished with that answer instead, replayed to every retry: needed\n" +
			"                when the phase is the flow's last, or when this binary does not have the key's flow.\n" +
			"  not-happened  the call did not take effect: its mark is cleared and the key released, so the phase\n" +
			"                runs again on the next retry or completer pass, making the call again: if it did\n" +
			"                happen, it happens twice (a charge is charged twice). Needs --confirm.\n" +
			"  abandon       give the request up: the key is finished, every retry gets the request-abandoned\n" +
			"                problem (HTTP 410, gRPC FAILED_PRECONDITION) and nothing runs again.\n" +
			"The key is claimed as a reconcile run claims it (its fence moves on, so a worker that held it can no\n" +
			"longer commit); a key someone holds, or in any other state, is refused and left as it is. --operator\n" +
			"and --reason (at least 3 words and 15 characters) are logged, and recorded with the key and, for\n" +
			"good, in its verdicts (keys show), with the database role and client address that applied it.\n" +
			"--dry-run checks the key and prints what would be done, changing nothing. Runs no phase and no hook.",
		examples: []string{
			"PROG keys resolve order-77 --scope tenant:acme --verdict not-happened --operator alice --reason 'INC-42: no SMS in the gateway log' --dry-run",
			"PROG keys resolve order-77 --scope tenant:acme --verdict not-happened --operator alice --reason 'INC-42: no SMS in the gateway log' --confirm",
			"PROG keys resolve order-77 --scope tenant:acme --verdict happened --operator alice --reason 'INC-42: charge ch_123 in the dashboard'",
			"PROG keys resolve order-77 --scope tenant:acme --verdict happened --status 201 --body @answer.json --operator alice --reason 'INC-42: sent by hand'",
			"PROG keys resolve order-77 --scope tenant:acme --verdict abandon --operator alice --reason 'INC-42: refunded by hand'",
		},
		setup: func(fs *flag.FlagSet) runFunc {
			scope := fs.String("scope", "", "the key's `scope` (required)")
			verdict := fs.String("verdict", "", "`verdict`: happened, not-happened or abandon (required)")
			operator := fs.String("operator", "", "who gives the verdict (`name`, required)")
			reason := fs.String("reason", "", "why: a ticket, what the provider showed (`text`, required)")
			status := fs.Int("status", 0, "with happened: finish the key with this HTTP `status` (200-599) instead of resuming it")
			body := fs.String("body", "", "with --status: the stored body, as `text` or @FILE")
			contentType := fs.String("content-type", "application/json", "with --body: the stored Content-Type")
			dryRun := fs.Bool("dry-run", false, "print what would be done; change nothing")
			confirm := fs.Bool("confirm", false, "with not-happened on a not-idempotent call in doubt: make the call again, knowing that if it did happen it happens twice")
			return func(ctx context.Context, e *env, args []string) error {
				v, err := idem.ParseResolveVerdict(*verdict)
				if err != nil {
					return usageError(e.cmd, "--verdict: %q is not happened, not-happened or abandon", *verdict)
				}
				res := idem.Resolution{Verdict: v, Operator: *operator, Reason: *reason, DryRun: *dryRun, ConfirmRerun: *confirm}
				// Runner.Resolve checks the rest (a reason that says too
				// little, say) before it reads the key: ErrInvalidRequest,
				// a usage error.
				switch {
				case strings.TrimSpace(*operator) == "" || strings.TrimSpace(*reason) == "":
					return usageError(e.cmd, "keys resolve: --operator and --reason are required: they are recorded with the key")
				case *status != 0 && v != idem.ResolveHappened:
					return usageError(e.cmd, "keys resolve: --status goes only with --verdict happened")
				case *status == 0 && *body != "":
					return usageError(e.cmd, "keys resolve: --body needs --status")
				case *status != 0:
					data := []byte(*body)
					if name, ok := strings.CutPrefix(*body, "@"); ok {
						if data, err = os.ReadFile(name); err != nil {
							return usageError(e.cmd, "--body: %v", err)
						}
					}
					res.Response = &idemtype.Response{Status: *status, Body: data}
					if len(data) > 0 {
						res.Response.Header = map[string][]string{"Content-Type": {*contentType}}
					}
				}
				if err := e.connect(ctx); err != nil {
					return err
				}
				out, err := e.runner.Resolve(ctx, *scope, args[0], res)
				if errors.Is(err, idem.ErrRerunNotConfirmed) {
					return fmt.Errorf("keys resolve: %w; nothing changed: if that is what you want, run again with --confirm", err)
				}
				if err != nil {
					return err
				}
				return e.printResolve(out)
			}
		},
	},
	{
		name: "reap", args: "[--batch-size N] [--max-batches N] [--unfinished-retention DURATION] [flags]", needsDB: true,
		summary: "delete expired keys and old unfinished ones, in small batches",
		help: "Runs one reaper pass: deletes expired finished keys batch by batch (each batch a short DELETE\n" +
			"under a statement timeout, skipping rows others have locked) until none is left, then unfinished\n" +
			"keys past their flow's UnfinishedRetention (7 days by default, counted from their creation),\n" +
			"never one a live lease holds nor one in needs_reconcile. A binary without the application's flows\n" +
			"does not know their UnfinishedRetention, so it deletes unfinished keys only with --unfinished-retention,\n" +
			"which then applies to every flow. Safe to run while the application serves traffic and while other\n" +
			"reapers run.",
		examples: []string{"PROG reap", "PROG reap --batch-size 500 --max-batches 100 --json", "PROG reap --unfinished-retention 168h"},
		setup: func(fs *flag.FlagSet) runFunc {
			def := (&idem.ReapConfig{}).WithDefaults()
			batch := fs.Int("batch-size", def.BatchSize, "keys deleted per statement")
			maxBatches := fs.Int("max-batches", 0, "stop after `n` batches (default: until none is left)")
			timeout := fs.Duration("statement-timeout", def.StatementTimeout, "bound on each batch's statement")
			abandon := fs.Duration("unfinished-retention", 0, "delete unfinished keys this much after their creation, whatever their flow "+
				"(default: each registered flow's UnfinishedRetention; none without flows)")
			// v0.1's name of the flag.
			fs.DurationVar(abandon, "abandon-after", 0, "the same as --unfinished-retention (v0.1's name)")
			return func(ctx context.Context, e *env, _ []string) error {
				switch {
				case *abandon < 0:
					return usageError(e.cmd, "--unfinished-retention %s is negative", *abandon)
				case *abandon > 0:
					e.abandonAfter = *abandon
				case len(e.cfg.Flows) == 0:
					e.abandonAfter = -1
				}
				if err := e.connect(ctx); err != nil {
					return err
				}
				res, err := e.runner.Reap(ctx, &idem.ReapConfig{BatchSize: *batch, MaxBatches: *maxBatches, StatementTimeout: *timeout})
				if err != nil {
					if res == nil {
						return &exitError{code: ExitUsage, err: err, hint: "reap"}
					}
					_ = e.printReap(res)
					return err
				}
				return e.printReap(res)
			}
		},
	},
	{
		name: "complete", args: "[--idle-for DURATION] [--max-keys N] [flags]", needsDB: true, needsFlows: true,
		summary: "finish requests their clients left unfinished, server-side (needs the application's flows)",
		help: "Runs one completer pass: every unfinished key of a registered flow that nobody holds and that\n" +
			"has not run for --idle-for is driven to its response from its stored params, through the flow's\n" +
			"phases, exactly as a client retry would; the response is stored for the client's next retry.\n" +
			"Keys in doubt go to needs_reconcile. Exits 1 if any key could not be finished or needs\n" +
			"reconciliation (run reconcile next: right after, it finds them), 0 when every key finished.\n" +
			"The generic idem binary has no flows: build your application's CLI with the idemcli package.",
		examples: []string{"PROG complete", "PROG complete --idle-for 30m --max-keys 100 --json"},
		setup: func(fs *flag.FlagSet) runFunc {
			def := (&idem.CompleteConfig{}).WithDefaults()
			idle := fs.Duration("idle-for", def.IdleFor, "only keys that have not run for this `duration`")
			batch := fs.Int("batch-size", def.BatchSize, "keys claimed at a time")
			attempts := fs.Int("max-attempts", def.MaxAttempts, "skip keys attempted this many `times` (-1: no limit)")
			maxKeys := fs.Int("max-keys", 0, "stop after `n` keys (default: until none is left)")
			return func(ctx context.Context, e *env, _ []string) error {
				if err := e.connect(ctx); err != nil {
					return err
				}
				res, err := e.runner.Complete(ctx, &idem.CompleteConfig{IdleFor: *idle, BatchSize: *batch, MaxAttempts: *attempts, MaxKeys: *maxKeys})
				if res == nil {
					return &exitError{code: ExitUsage, err: err, hint: "complete"}
				}
				if perr := e.printComplete(res); perr != nil {
					return perr
				}
				if err != nil {
					return err
				}
				var undone []error
				if res.Failed > 0 {
					undone = append(undone, fmt.Errorf("%d key(s) could not be finished; see the log above and `%s keys list --all-scopes --state stale`", res.Failed, e.cfg.Name))
				}
				if res.NeedsReconcile > 0 {
					undone = append(undone, fmt.Errorf("%d key(s) need reconciliation; run `%s reconcile`", res.NeedsReconcile, e.cfg.Name))
				}
				if len(undone) > 0 {
					return &exitError{code: ExitFailure, err: errors.Join(undone...)}
				}
				return nil
			}
		},
	},
	{
		name: "reconcile", args: "[KEY --scope SCOPE] [--idle-for DURATION] [flags]", maxArgs: 1, needsDB: true, needsFlows: true,
		summary: "run reconcile hooks on needs_reconcile keys (needs the application's flows)",
		help: "With KEY, reconciles that key now. Without, runs one pass over every needs_reconcile key of a\n" +
			"registered flow that nobody holds (with --idle-for, only those that have not run for that long;\n" +
			"the Maintainer waits its IdleFor, 1 minute, between tries of a key whose hook cannot tell, but an\n" +
			"operator's run takes them all). A key whose hook gives a verdict is carried on\n" +
			"to its stored response; a hook that cannot tell leaves the key for later. Exits 1 if any key is\n" +
			"left unresolved or failed, 3 if KEY does not exist, 0 if KEY does not need reconciling.",
		examples: []string{
			"PROG reconcile",
			"PROG reconcile order-77 --scope tenant:acme",
			"PROG reconcile --idle-for 1s --json",
		},
		setup: func(fs *flag.FlagSet) runFunc {
			scope := fs.String("scope", "", "the `scope` of KEY (required with KEY)")
			idle := fs.Duration("idle-for", 0, "without KEY: only keys that have not run for this `duration` (default: every key nobody holds)")
			batch := fs.Int("batch-size", 10, "without KEY: keys claimed at a time")
			maxKeys := fs.Int("max-keys", 0, "without KEY: stop after `n` keys (default: until none is left)")
			return func(ctx context.Context, e *env, args []string) error {
				if err := e.connect(ctx); err != nil {
					return err
				}
				if len(args) == 1 {
					return e.reconcileOne(ctx, *scope, args[0])
				}
				if *idle < 0 {
					return usageError(e.cmd, "--idle-for %s is negative", *idle)
				}
				// Every key nobody holds, however recently it ran (a
				// complete run just before claimed it): the sweep needs a
				// positive bound, and a microsecond is the store's grain.
				res, err := e.runner.ReconcileAll(ctx, &idem.ReconcileConfig{IdleFor: max(*idle, time.Microsecond), BatchSize: *batch, MaxKeys: *maxKeys})
				if res == nil {
					return &exitError{code: ExitUsage, err: err, hint: "reconcile"}
				}
				if perr := e.printReconcile(res); perr != nil {
					return perr
				}
				if err != nil {
					return err
				}
				if left := res.Unresolved + res.Failed + res.NoHook; left > 0 {
					return &exitError{code: ExitFailure, err: fmt.Errorf("%d key(s) still need attention; see `keys list --state needs_reconcile`", left)}
				}
				return nil
			}
		},
	},
}

var commandsByName = func() map[string]*command {
	m := map[string]*command{}
	for _, c := range commands {
		m[c.name] = c
	}
	return m
}()

// subcommandsOf returns the subcommands of a command group ("keys").
func subcommandsOf(group string) []string {
	var subs []string
	for _, c := range commands {
		if g, sub, ok := strings.Cut(c.name, " "); ok && g == group {
			subs = append(subs, sub)
		}
	}
	return subs
}

func (e *env) reconcileOne(ctx context.Context, scope, key string) error {
	out, err := e.runner.Reconcile(ctx, scope, key)
	switch {
	case errors.Is(err, idem.ErrNothingToReconcile):
		return e.printReconcileOne(out, "nothing to reconcile: the key is "+string(out.Record.Status), nil)
	case errors.Is(err, idem.ErrNotFound):
		return err
	case errors.Is(err, idem.ErrNoRedrive):
		return e.printReconcileOne(out, "reconciled: the key waits for its client's retry (its flow cannot run from the stored input)", nil)
	case err == nil:
		return e.printReconcileOne(out, fmt.Sprintf("reconciled: the key finished with status %d", out.Response.Status), nil)
	case out.Kind == idem.OutcomeNeedsReconcile:
		return e.printReconcileOne(out, "still needs reconciliation", &exitError{code: ExitFailure, err: err})
	}
	return e.printReconcileOne(out, "failed", &exitError{code: ExitFailure, err: err})
}

// help prints the overview, or a command's help.
func (e *env) help(args []string) error {
	if len(args) == 0 {
		e.printOverview(e.out)
		return nil
	}
	name := strings.Join(args, " ")
	if cmd, ok := commandsByName[name]; ok {
		e.printCommandHelp(cmd)
		return nil
	}
	if subs := subcommandsOf(name); len(subs) > 0 {
		fmt.Fprintf(e.out, "%s takes a subcommand:\n\n", name)
		for _, c := range commands {
			if strings.HasPrefix(c.name, name+" ") {
				fmt.Fprintf(e.out, "  %s %-16s %s\n", e.cfg.Name, c.name, c.summary)
			}
		}
		fmt.Fprintf(e.out, "\nRun '%s help %s SUBCOMMAND' for its flags and examples.\n", e.cfg.Name, name)
		return nil
	}
	return usageError(nil, "help: unknown command %q", name)
}

func (e *env) printOverview(w io.Writer) {
	name := e.cfg.Name
	fmt.Fprintf(w, "%s operates idem's idempotency keys in Postgres: migrations, inspection, unlocks,\n", name)
	fmt.Fprintf(w, "and on-demand reaper, completer and reconcile runs.\n\n")
	fmt.Fprintf(w, "Usage:\n  %s COMMAND [ARGS] [--schema SCHEMA] [--json] [-v] [FLAGS]\n\nCommands:\n", name)
	for _, c := range commands {
		note := ""
		if c.needsFlows && len(e.cfg.Flows) == 0 {
			note = " [not in this binary]"
		}
		fmt.Fprintf(w, "  %-16s %s%s\n", c.name, c.summary, note)
	}
	fmt.Fprintf(w, "\nEnvironment:\n  DATABASE_URL     the database, e.g. postgres://app:secret@db:5432/app\n")
	fmt.Fprintf(w, "\nExit codes:\n")
	fmt.Fprintf(w, "  %d  ok\n  %d  failure, or work left undone (a key not completed, left to reconciliation, or not resolved)\n", ExitOK, ExitFailure)
	fmt.Fprintf(w, "  %d  usage: bad command line or DATABASE_URL unset; nothing ran\n  %d  the key does not exist\n", ExitUsage, ExitNotFound)
	fmt.Fprintf(w, "  %d  complete/reconcile need the application's flows, which this binary does not have\n", ExitNoFlows)
	fmt.Fprintf(w, "\nFlows registered: %s\n", flowList(e.cfg.Flows))
	fmt.Fprintf(w, "Run '%s help COMMAND' for a command's flags and examples.\n", name)
}

func flowList(flows []idem.AnyFlow) string {
	if len(flows) == 0 {
		return "none (complete and reconcile need an application build; see the idemcli package)"
	}
	names := make([]string, len(flows))
	for i, f := range flows {
		names[i] = f.Name()
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func (e *env) printCommandHelp(cmd *command) {
	w := e.out
	fmt.Fprintf(w, "Usage: %s %s %s\n\n%s.\n", e.cfg.Name, cmd.name, cmd.args, upperFirst(cmd.summary))
	if cmd.help != "" {
		fmt.Fprintf(w, "\n%s\n", cmd.help)
	}
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	cmd.setup(fs)
	if hasFlags(fs) {
		fmt.Fprintf(w, "\nFlags:\n")
		printFlags(w, fs)
	}
	global := flag.NewFlagSet("global", flag.ContinueOnError)
	(&env{}).globalFlags(global)
	fmt.Fprintf(w, "\nGlobal flags:\n")
	printFlags(w, global)
	if cmd.needsDB {
		fmt.Fprintf(w, "\nReads the database from DATABASE_URL.\n")
	}
	fmt.Fprintf(w, "\nExamples:\n")
	for _, ex := range cmd.examples {
		fmt.Fprintf(w, "  %s\n", strings.ReplaceAll(ex, "PROG", e.cfg.Name))
	}
}

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

// printFlags lists flags GNU-style (--name value), which the parser accepts
// as well as -name.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if len(f.Name) == 1 {
			line = "  -" + f.Name
		}
		if arg != "" {
			line += " " + arg
		}
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" && f.DefValue != "-1" && !strings.Contains(usage, "(default") {
			usage += " (default " + strconv.Quote(f.DefValue) + ")"
			usage = strings.ReplaceAll(usage, `"`, "")
		}
		fmt.Fprintf(w, "%-30s %s\n", line, usage)
	})
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// writeMigrationFiles writes into dir one file per migration version that
// is not there yet (a team may have renumbered or applied the others),
// numbered after dir's highest for goose and tern (Migrator.FilesFor), and
// says which it wrote.
func (e *env) writeMigrationFiles(m *migrations.Migrator, format migrations.Format, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	existing := make([]string, 0, len(entries))
	for _, entry := range entries {
		existing = append(existing, entry.Name())
	}
	files, err := m.FilesFor(format, existing)
	if err != nil {
		return &exitError{code: ExitUsage, err: err, hint: "migrate sql"}
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	written := []string{}
	for _, name := range names {
		path := filepath.Join(dir, name)
		if _, err := os.Stat(path); err == nil {
			continue
		}
		if err := os.WriteFile(path, []byte(files[name]), 0o644); err != nil {
			return err
		}
		written = append(written, name)
	}
	if e.json {
		return e.printJSON(map[string]any{"dir": dir, "written": written})
	}
	if len(written) == 0 {
		_, err = fmt.Fprintf(e.out, "%s already holds every migration\n", dir)
		return err
	}
	for _, name := range written {
		if _, err := fmt.Fprintf(e.out, "wrote %s\n", filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return nil
}

// lockTimeoutFlag is migrate's --lock-timeout (migrations.Config.LockTimeout).
func lockTimeoutFlag(fs *flag.FlagSet) *time.Duration {
	return fs.Duration("lock-timeout", migrations.LockTimeoutDefault,
		"give up, applying nothing, after waiting this long for a lock another transaction holds on idem's tables (negative: no limit)")
}
