package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/cmd/idem/internal/testflows"
	"github.com/go-idem/idem/idemcli"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/migrations"
	"github.com/go-idem/idem/pgstore"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// binaries are the two programs under test: the generic idem binary, and
// flowapp, an application's CLI built with idemcli and its flows.
type binaries struct{ idem, flowapp string }

func build(t *testing.T) *binaries {
	t.Helper()
	goTool, err := exec.LookPath("go")
	require.NoError(t, err, "the CLI tests build the binaries with the go command, which must be on PATH")
	dir := t.TempDir()
	bins := &binaries{idem: filepath.Join(dir, "idem"), flowapp: filepath.Join(dir, "flowapp")}
	for out, pkg := range map[string]string{bins.idem: ".", bins.flowapp: "./testdata/flowapp"} {
		cmd := exec.Command(goTool, "build", "-o", out, pkg)
		output, err := cmd.CombinedOutput()
		require.NoError(t, err, "go build %s: %s", pkg, output)
	}
	return bins
}

// bundle is one subtest's database and the in-process side of the story:
// a store and the same flows, to put keys in the states the CLI acts on.
type bundle struct {
	*binaries
	schema *pgtest.Schema
	store  *pgstore.Store
	orders *idem.Flow[testflows.Order]
	texts  *idem.Flow[testflows.Text]
}

func setup(t *testing.T, bins *binaries, migrate bool) *bundle {
	t.Helper()
	ctx := context.Background()
	schema := pgtest.NewSchema(t)
	if migrate {
		m, err := migrations.New(schema.Pool, &migrations.Config{Schema: schema.Name})
		require.NoError(t, err)
		_, err = m.Up(ctx)
		require.NoError(t, err)
		_, err = schema.Pool.Exec(ctx, testflows.Schema)
		require.NoError(t, err)
	}
	b := &bundle{binaries: bins, schema: schema, orders: testflows.Orders(schema.Pool), texts: testflows.Texts(schema.Pool)}
	if migrate {
		// A store checks the schema it is given, so only a migrated one
		// gets a store.
		store, err := pgstore.New(schema.Pool, &pgstore.Config{Schema: schema.Name})
		require.NoError(t, err)
		t.Cleanup(store.Close)
		b.store = store
	}
	return b
}

type result struct {
	stdout, stderr string
	code           int
}

// run runs a binary with DATABASE_URL pointing at the bundle's schema.
func (b *bundle) run(t *testing.T, bin string, args ...string) result {
	t.Helper()
	return b.runEnv(t, bin, []string{"DATABASE_URL=" + b.schema.URL}, args...)
}

func (b *bundle) runEnv(t *testing.T, bin string, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return result{stdout.String(), stderr.String(), code}
}

// runner is an application process. clock, when set, replaces the
// database clock, to leave keys that look hours old.
func (b *bundle) runner(t *testing.T, clock func() time.Time, hook func(context.Context, idemtest.HookPoint) error) *idem.Runner {
	t.Helper()
	r, err := idem.NewRunner(b.store, &idem.Config{
		Lease: time.Hour, Flows: []idem.AnyFlow{b.orders, b.texts}, Logger: slog.New(slog.DiscardHandler),
		Test: idemtest.WithHook(idem.TestConfig{Now: clock}, hook),
	})
	require.NoError(t, err)
	return r
}

func at(t time.Time) func() time.Time { return func() time.Time { return t } }

func crashAt(where idemtest.HookWhere, phase string) func(context.Context, idemtest.HookPoint) error {
	return func(_ context.Context, at idemtest.HookPoint) error {
		if at.Where == where && at.Phase == phase {
			return idemtest.ErrSimulatedCrash
		}
		return nil
	}
}

func order(key string) idem.Request {
	return idem.Request{Scope: "user:1", Key: key, Method: "POST", Path: "/orders", Params: testflows.Order{Item: "book", Amount: 1200}}
}

func text(key string, unknown bool) idem.Request {
	return idem.Request{Scope: "user:2", Key: key, Method: "POST", Path: "/texts", Params: testflows.Text{To: "+15550100", Unknown: unknown}}
}

// abandonOrder leaves an order charged but unfinished, its lease long
// expired: the client gave up an hour ago.
func (b *bundle) abandonOrder(t *testing.T, key string) {
	t.Helper()
	_, err := b.runner(t, at(time.Now().Add(-2*time.Hour)), crashAt(idemtest.HookAfterForeign, "charged")).
		Execute(context.Background(), b.orders, order(key))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
}

// doubtfulText leaves a text in needs_reconcile, idle for an hour: the
// message was sent, the phase never committed.
func (b *bundle) doubtfulText(t *testing.T, key string, unknown bool) {
	t.Helper()
	ctx := context.Background()
	_, err := b.runner(t, at(time.Now().Add(-3*time.Hour)), crashAt(idemtest.HookAfterForeign, "sent")).Execute(ctx, b.texts, text(key, unknown))
	require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
	_, err = b.runner(t, at(time.Now().Add(-time.Hour)), nil).Execute(ctx, b.texts, text(key, unknown))
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
}

func (b *bundle) count(t *testing.T, sql string) int {
	t.Helper()
	var n int
	require.NoError(t, b.schema.Pool.QueryRow(context.Background(), "SELECT "+sql).Scan(&n))
	return n
}

func (b *bundle) key(t *testing.T, scope, key string) *idemtype.KeyRecord {
	t.Helper()
	rec, err := b.store.GetKey(context.Background(), scope, key)
	require.NoError(t, err)
	return rec
}

func decode[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal([]byte(s), &v), s)
	return v
}

// TestBinary builds both binaries once and runs every command against
// databases of its subtests' own.
func TestBinary(t *testing.T) {
	t.Parallel()
	bins := build(t)

	t.Run("help and usage errors", func(t *testing.T) {
		t.Parallel()
		b := &bundle{binaries: bins}
		res := b.runEnv(t, bins.idem, nil, "help")
		require.Equal(t, idemcli.ExitOK, res.code)
		for _, want := range []string{"migrate up", "keys list", "keys unlock", "reap", "complete", "Exit codes", "DATABASE_URL"} {
			require.Contains(t, res.stdout, want)
		}
		require.Contains(t, res.stdout, "[not in this binary]")

		for _, args := range [][]string{{"help", "keys", "list"}, {"keys", "list", "--help"}, {"keys", "list", "-h"}} {
			res := b.runEnv(t, bins.idem, nil, args...)
			require.Equal(t, idemcli.ExitOK, res.code, args)
			require.Contains(t, res.stdout, "Usage: idem keys list")
			require.Contains(t, res.stdout, "Examples:\n  idem keys list --all-scopes --state stale")
			require.Contains(t, res.stdout, "--state state")
		}
		// Every command's help has examples.
		for _, cmd := range []string{"migrate up", "migrate down", "migrate status", "migrate sql", "keys list", "keys show", "keys unlock", "keys resolve", "reap", "complete", "reconcile"} {
			res := b.runEnv(t, bins.idem, nil, append([]string{"help"}, strings.Fields(cmd)...)...)
			require.Equal(t, idemcli.ExitOK, res.code, cmd)
			require.Regexp(t, `Examples:\n  \S`, res.stdout, cmd)
		}

		for name, tc := range map[string]struct {
			args []string
			want string
		}{
			"no command":   {nil, "Commands:"},
			"unknown":      {[]string{"frobnicate"}, `unknown command "frobnicate"`},
			"unknown sub":  {[]string{"keys", "delete"}, `unknown command "keys delete"`},
			"no sub":       {[]string{"migrate"}, "migrate needs a subcommand: up, down, status, sql"},
			"bad flag":     {[]string{"keys", "list", "--colour"}, "flag provided but not defined: -colour"},
			"bad state":    {[]string{"keys", "list", "--state", "asleep"}, `unknown key state "asleep"`},
			"no scope":     {[]string{"keys", "show", "k1"}, "--scope is required with KEY"},
			"no key":       {[]string{"keys", "show", "--scope", "s"}, "usage: idem keys show KEY"},
			"two keys":     {[]string{"keys", "unlock", "a", "b", "--scope", "s"}, "usage: idem keys unlock KEY"},
			"no database":  {[]string{"keys", "list", "--all-scopes"}, "DATABASE_URL is not set"},
			"no scope set": {[]string{"keys", "list"}, "--all-scopes"},
			"bad format":   {[]string{"migrate", "sql", "--format", "flyway"}, `unknown format "flyway"`},
			"bad schema":   {[]string{"migrate", "sql", "--schema", `a"b`}, "invalid schema name"},
			"bad limit":    {[]string{"keys", "list", "--limit", "0"}, "--limit 0 is outside"},
			"flag value":   {[]string{"reap", "--batch-size", "many"}, "invalid value"},
			"help unknown": {[]string{"help", "nope"}, `unknown command "nope"`},
		} {
			res := b.runEnv(t, bins.idem, nil, tc.args...)
			require.Equal(t, idemcli.ExitUsage, res.code, "%s: %+v", name, res)
			require.Contains(t, res.stderr, tc.want, name)
			require.Empty(t, res.stdout, name)
		}
	})

	t.Run("migrate", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bins, false)
		res := b.run(t, bins.idem, "migrate", "status", "--schema", b.schema.Name)
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		require.Regexp(t, `0001\s+idem_keys\s+pending`, res.stdout)
		require.Contains(t, res.stdout, "run `idem migrate up`")

		res = b.run(t, bins.idem, "migrate", "up", "--schema", b.schema.Name)
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		require.Equal(t, "applied 0001, 0002, 0003, 0004, 0005, 0006, 0007: the schema went from version 0 to 7\n", res.stdout)
		res = b.run(t, bins.idem, "--json", "migrate", "up", "--schema", b.schema.Name)
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		require.JSONEq(t, `{"from": 7, "to": 7, "applied": []}`, res.stdout)

		status := decode[struct {
			Current, Latest, Pending int
		}](t, b.run(t, bins.idem, "migrate", "status", "--json", "--schema", b.schema.Name).stdout)
		require.Equal(t, migrations.Latest(), status.Current)
		require.Zero(t, status.Pending)

		// A schema ahead of the binary: status says so, and up refuses.
		next := migrations.Latest() + 1
		_, err := b.schema.Pool.Exec(context.Background(), `INSERT INTO idem_migrations (version, name) VALUES ($1, 'next')`, next)
		require.NoError(t, err)
		res = b.run(t, bins.idem, "migrate", "status", "--schema", b.schema.Name)
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, fmt.Sprintf("ahead of this binary (latest %d)", next-1))
		res = b.run(t, bins.idem, "migrate", "up", "--schema", b.schema.Name)
		require.NotEqual(t, idemcli.ExitOK, res.code)
		require.Contains(t, res.stderr, fmt.Sprintf("the database is at version %d, this binary knows up to %d", next, next-1))
		_, err = b.schema.Pool.Exec(context.Background(), `DELETE FROM idem_migrations WHERE version = $1`, next)
		require.NoError(t, err)

		// The SQL other tools apply, for the named schema.
		res = b.run(t, bins.idem, "migrate", "sql", "--format", "goose", "--schema", "billing")
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "-- +goose Up")
		require.Contains(t, res.stdout, `CREATE TABLE "billing".idem_keys`)
		m, err := migrations.New(nil, &migrations.Config{Schema: "billing"})
		require.NoError(t, err)
		want, err := m.Script(migrations.FormatGoose, migrations.DirectionUp, 0)
		require.NoError(t, err)
		require.Equal(t, want, res.stdout, "exactly the migrations package's Script")
		res = b.runEnv(t, bins.idem, nil, "migrate", "sql", "--format", "tern", "--version", "1")
		require.Equal(t, idemcli.ExitOK, res.code)
		require.Contains(t, res.stdout, "---- create above / drop below ----")
		res = b.runEnv(t, bins.idem, nil, "migrate", "sql", "--version", "99")
		require.Equal(t, idemcli.ExitUsage, res.code)

		// Down reverts one version by default; the schema's search_path
		// resolves the tables without --schema too.
		res = b.run(t, bins.idem, "migrate", "down")
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		require.Equal(t, "reverted 0007: the schema went from version 7 to 6\n", res.stdout)
		res = b.run(t, bins.idem, "migrate", "down")
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		require.Equal(t, "reverted 0006: the schema went from version 6 to 5\n", res.stdout)
		res = b.run(t, bins.idem, "migrate", "down")
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		require.Equal(t, "reverted 0005: the schema went from version 5 to 4\n", res.stdout)
		res = b.run(t, bins.idem, "migrate", "down")
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		require.Equal(t, "reverted 0004: the schema went from version 4 to 3\n", res.stdout)
		res = b.run(t, bins.idem, "migrate", "down")
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		require.Equal(t, "reverted 0003: the schema went from version 3 to 2\n", res.stdout)
		res = b.run(t, bins.idem, "migrate", "down")
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		require.Equal(t, "reverted 0002: the schema went from version 2 to 1\n", res.stdout)
		res = b.run(t, bins.idem, "migrate", "down")
		require.Equal(t, idemcli.ExitUsage, res.code, "going below version 1 drops the keys: it needs --yes")
		require.Contains(t, res.stderr, "pass --yes")
		res = b.run(t, bins.idem, "migrate", "down", "--yes")
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		require.Equal(t, "reverted 0001: the schema went from version 1 to 0\n", res.stdout)
		require.Zero(t, b.count(t, "count(*) FROM pg_tables WHERE tablename = 'idem_keys' AND schemaname = current_schema()"))
		res = b.run(t, bins.idem, "migrate", "down", "--to", strconv.Itoa(migrations.Latest()+1))
		require.Equal(t, idemcli.ExitUsage, res.code)
		require.Contains(t, res.stderr, "unknown version")
	})

	t.Run("keys list and show", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bins, true)
		ctx := context.Background()
		now := time.Now()
		_, err := b.runner(t, nil, nil).Execute(ctx, b.orders, order("finished-1"))
		require.NoError(t, err)
		_, err = b.runner(t, at(now.Add(-48*time.Hour)), nil).Execute(ctx, b.orders, order("expired-1"))
		require.NoError(t, err)
		_, err = b.runner(t, nil, crashAt(idemtest.HookPhaseStart, "charged")).Execute(ctx, b.orders, order("running-1"))
		require.ErrorIs(t, err, idemtest.ErrSimulatedCrash)
		b.abandonOrder(t, "stale-1")
		b.doubtfulText(t, "doubtful-1", false)

		res := b.run(t, bins.idem, "keys", "list", "--all-scopes", "--schema", b.schema.Name)
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
		require.Len(t, lines, 6, res.stdout) // header and five keys; no paging hint, nothing is older
		require.Regexp(t, `^ID\s+SCOPE\s+KEY\s+FLOW\s+STATE\s+RECOVERY POINT\s+ATTEMPTS\s+LAST RUN\s+EXPIRES$`, lines[0])
		for _, want := range []string{
			`doubtful-1\s+texts.send\s+needs_reconcile\s+started\s+2\s`,
			`stale-1\s+orders.create\s+stale\s+order_created\s+1\s`,
			`running-1\s+orders.create\s+running\s+order_created\s`,
			`expired-1\s+orders.create\s+expired\s+finished\s`,
			`finished-1\s+orders.create\s+finished\s+finished\s`,
		} {
			require.Regexp(t, want, res.stdout)
		}

		for state, want := range map[string]string{
			"running": "running-1", "stale": "stale-1", "needs_reconcile": "doubtful-1",
			"finished": "finished-1", "expired": "expired-1",
		} {
			res := b.run(t, bins.idem, "keys", "list", "--all-scopes", "--state", state, "--json", "--schema", b.schema.Name)
			require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
			list := decode[struct {
				Now  time.Time
				Keys []struct {
					Key, State string
				}
			}](t, res.stdout)
			require.Len(t, list.Keys, 1, state)
			require.Equal(t, want, list.Keys[0].Key)
			require.Equal(t, state, list.Keys[0].State)
			require.WithinDuration(t, time.Now(), list.Now, time.Hour, "the database clock")
		}
		res = b.run(t, bins.idem, "keys", "list", "--flow", "texts.send", "--scope", "user:2")
		require.Equal(t, idemcli.ExitOK, res.code)
		require.Contains(t, res.stdout, "doubtful-1")
		require.NotContains(t, res.stdout, "orders.create")
		res = b.run(t, bins.idem, "keys", "list", "--scope", "nobody")
		require.Equal(t, idemcli.ExitOK, res.code)
		require.Equal(t, "no keys match\n", res.stdout)
		res = b.run(t, bins.idem, "keys", "list", "--all-scopes", "--limit", "2", "--json")
		require.Len(t, decode[struct{ Keys []any }](t, res.stdout).Keys, 2)

		// show: flags after the key work too.
		res = b.run(t, bins.idem, "keys", "show", "finished-1", "--scope", "user:1", "--reveal", "--schema", b.schema.Name)
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		for _, want := range []string{
			`(?m)^state\s+finished$`, `(?m)^flow\s+orders.create$`, `(?m)^request\s+POST /orders$`,
			`(?m)^response status\s+201 Created$`, `(?m)^response body\s+\{"order_id":\d+\}$`,
			`(?m)^params\s+\{"item": "book", "amount": 1200\}$`, `(?m)^checkpoint\s+\{"order_id":\d+\}$`,
		} {
			require.Regexp(t, want, res.stdout)
		}
		res = b.run(t, bins.idem, "keys", "show", "--json", "--scope", "user:2", "doubtful-1")
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		shown := decode[struct {
			Key, State, Status string
			ForeignMark        string `json:"foreign_mark"`
		}](t, res.stdout)
		require.Equal(t, "doubtful-1", shown.Key)
		require.Equal(t, "needs_reconcile", shown.State)
		require.Equal(t, "sent", shown.ForeignMark)

		res = b.run(t, bins.idem, "keys", "show", "missing", "--scope", "user:1")
		require.Equal(t, idemcli.ExitNotFound, res.code)
		require.Contains(t, res.stderr, "key not found")
		require.Empty(t, res.stdout)
	})

	t.Run("keys unlock stops a live holder", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bins, true)
		ctx := context.Background()
		beforeCommit, unlocked := make(chan struct{}), make(chan struct{})
		holder := b.runner(t, nil, func(_ context.Context, at idemtest.HookPoint) error {
			if at.Where == idemtest.HookBeforeCommit && at.Phase == "charged" {
				close(beforeCommit)
				<-unlocked
			}
			return nil
		})
		done := make(chan error, 1)
		go func() {
			_, err := holder.Execute(ctx, b.orders, order("k1"))
			done <- err
		}()
		<-beforeCommit
		fence := b.key(t, "user:1", "k1").Fence

		res := b.run(t, bins.idem, "keys", "unlock", "k1", "--scope", "user:1", "--reason", "wedged worker, INC-7")
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, `unlocked key "k1" (scope "user:1")`)
		require.Contains(t, res.stdout, "the next attempt resumes after order_created")
		close(unlocked)
		require.ErrorIs(t, <-done, idem.ErrLockLost, "the holder cannot commit after the unlock")

		rec := b.key(t, "user:1", "k1")
		require.Equal(t, fence+1, rec.Fence)
		require.Equal(t, "order_created", rec.RecoveryPoint, "the charged phase did not commit")
		require.Nil(t, rec.LockedAt)
		require.Equal(t, "wedged worker, INC-7", rec.LastError)

		// The next attempt resumes; the provider deduplicates the charge.
		out, err := b.runner(t, nil, nil).Execute(ctx, b.orders, order("k1"))
		require.NoError(t, err)
		require.True(t, out.TookOver)
		require.Equal(t, 1, b.count(t, "count(*) FROM charges"))

		res = b.run(t, bins.idem, "keys", "unlock", "k1", "--scope", "user:1", "--json")
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		require.False(t, decode[struct{ Unlocked bool }](t, res.stdout).Unlocked, "a finished key has nothing to unlock")
		require.Equal(t, fence+2, b.key(t, "user:1", "k1").Fence, "only the takeover moved the fence since")
		res = b.run(t, bins.idem, "keys", "unlock", "k2", "--scope", "user:1")
		require.Equal(t, idemcli.ExitNotFound, res.code)
	})

	t.Run("reap", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bins, true)
		ctx := context.Background()
		old := b.runner(t, at(time.Now().Add(-48*time.Hour)), nil)
		for _, k := range []string{"old-1", "old-2", "old-3"} {
			_, err := old.Execute(ctx, b.orders, order(k))
			require.NoError(t, err)
		}
		_, err := b.runner(t, nil, nil).Execute(ctx, b.orders, order("new-1"))
		require.NoError(t, err)
		b.abandonOrder(t, "abandoned-1")

		res := b.run(t, bins.idem, "reap", "--batch-size", "2", "--schema", b.schema.Name)
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		require.Equal(t, "reaped 3 expired key(s) in 2 batch(es), and 0 unfinished key(s) past their retention\n", res.stdout)
		require.Equal(t, 2, b.count(t, "count(*) FROM idem_keys"))
		require.Equal(t, 5, b.count(t, "count(*) FROM orders"), "business rows survive")
		require.Equal(t, 3, b.count(t, "count(*) FROM orders WHERE key_id IS NULL"))

		res = b.run(t, bins.idem, "reap", "--json")
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		require.JSONEq(t, `{"deleted": 0, "batches": 1, "unfinished": 0, "needs_reconcile": 0}`, res.stdout)

		res = b.run(t, bins.idem, "reap", "--batch-size", "-1")
		require.Equal(t, idemcli.ExitUsage, res.code)
		require.Contains(t, res.stderr, "invalid reap config: BatchSize -1 is outside 1-100000")
	})

	t.Run("complete", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bins, true)
		b.abandonOrder(t, "k1")
		require.Equal(t, 1, b.count(t, "count(*) FROM charges"))

		res := b.run(t, bins.idem, "complete")
		require.Equal(t, idemcli.ExitNoFlows, res.code)
		require.Contains(t, res.stderr, "this binary has no flows registered")
		require.Contains(t, res.stderr, "idemcli")

		res = b.run(t, bins.flowapp, "complete", "--schema", b.schema.Name)
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		require.Equal(t, "claimed 1 idle key(s): 1 completed, 0 skipped (a client got there first), 0 need reconciliation, 0 failed\n", res.stdout)
		rec := b.key(t, "user:1", "k1")
		require.Equal(t, idemtype.StoredFinished, rec.Status)
		require.Equal(t, 1, b.count(t, "count(*) FROM charges"), "exactly one charge")
		require.Equal(t, 2, b.count(t, "calls FROM charges"), "the charge was re-sent with the same downstream key")
		require.Equal(t, 1, b.count(t, "count(*) FROM orders"))

		// The client's late retry gets the stored response.
		out, err := b.runner(t, nil, nil).Execute(context.Background(), b.orders, order("k1"))
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeReplayed, out.Kind)
		require.Equal(t, rec.ResponseBody, out.Response.Body)

		res = b.run(t, bins.flowapp, "complete", "--json")
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		require.JSONEq(t, `{"claimed": 0, "completed": 0, "skipped": 0, "needs_reconcile": 0, "failed": 0}`, res.stdout)
	})

	t.Run("reconcile", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bins, true)
		b.doubtfulText(t, "t1", false)
		b.doubtfulText(t, "t2", false)
		b.doubtfulText(t, "t3", true)

		res := b.run(t, bins.idem, "reconcile")
		require.Equal(t, idemcli.ExitNoFlows, res.code)

		res = b.run(t, bins.flowapp, "reconcile", "t1", "--scope", "user:2")
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		require.Equal(t, "key \"t1\" (scope \"user:2\"): reconciled: the key finished with status 201\n", res.stdout)
		require.Equal(t, idemtype.StoredFinished, b.key(t, "user:2", "t1").Status)

		res = b.run(t, bins.flowapp, "reconcile", "t1", "--scope", "user:2")
		require.Equal(t, idemcli.ExitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "nothing to reconcile: the key is finished")
		res = b.run(t, bins.flowapp, "reconcile", "t9", "--scope", "user:2")
		require.Equal(t, idemcli.ExitNotFound, res.code)

		// A pass: t2 resolves, t3's gateway cannot tell, so the exit code
		// says work is left.
		res = b.run(t, bins.flowapp, "reconcile", "--json", "--schema", b.schema.Name)
		require.Equal(t, idemcli.ExitFailure, res.code, res.stderr)
		require.JSONEq(t, `{"claimed": 2, "resolved": 1, "unresolved": 1, "skipped": 0, "failed": 0, "no_hook": 0}`, res.stdout)
		require.Contains(t, res.stderr, "1 key(s) still need attention")
		require.Equal(t, idemtype.StoredFinished, b.key(t, "user:2", "t2").Status)
		require.Equal(t, idemtype.StoredNeedsReconcile, b.key(t, "user:2", "t3").Status)
		require.Equal(t, 3, b.count(t, "count(*) FROM texts_sent"), "one message per key, none re-sent")

		res = b.run(t, bins.flowapp, "reconcile", "t3", "--scope", "user:2")
		require.Equal(t, idemcli.ExitFailure, res.code)
		require.Contains(t, res.stdout, "still needs reconciliation")
		require.Contains(t, res.stderr, "the gateway cannot tell")
	})
}
