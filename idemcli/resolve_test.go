package idemcli

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/pgstore"
)

// resolveFixture is an application whose SMS send (not idempotent, no way
// to ask the gateway) left keys in needs_reconcile.
type resolveFixture struct {
	schema *pgtest.Schema
	flow   *idem.Flow[payment]
	runner *idem.Runner
	sends  atomic.Int32
	down   atomic.Bool
}

func newResolveFixture(t *testing.T) *resolveFixture {
	t.Helper()
	f := &resolveFixture{schema: pgtest.NewMigratedSchema(t)}
	f.flow = idem.MustNewFlow("sms.send", []idem.Phase[payment]{
		{
			Name:    "sent",
			Foreign: idem.ForeignNotIdempotent,
			Do: func(ctx context.Context, _ idem.Tx, run *idem.Attempt[payment]) (idem.Result, error) {
				return idem.Advance(), run.Foreign(ctx, "send", func(context.Context, string) error {
					if f.down.Load() {
						return errors.New("gateway timeout")
					}
					f.sends.Add(1)
					return nil
				})
			},
			Reconcile: func(context.Context, idem.Tx, *idem.Attempt[payment]) (idem.ReconcileVerdict, error) {
				return idem.ReconcileUnknown("the gateway has no lookup"), nil
			},
		},
		{
			Name: "responded",
			Do: func(context.Context, idem.Tx, *idem.Attempt[payment]) (idem.Result, error) {
				return idem.RespondJSON(201, "sent"), nil
			},
		},
	}, nil)
	store, err := pgstore.New(f.schema.Pool, &pgstore.Config{Schema: f.schema.Name})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	f.runner, err = idem.NewRunner(store, &idem.Config{Flows: []idem.AnyFlow{f.flow}})
	require.NoError(t, err)
	return f
}

func (f *resolveFixture) execute(key string) (*idem.Outcome, error) {
	return f.runner.Execute(context.Background(), f.flow, idem.Request{Scope: "s", Key: key, Params: payment{Card: "c", Amount: 1}})
}

func (f *resolveFixture) inDoubt(t *testing.T, key string) {
	t.Helper()
	f.down.Store(true)
	defer f.down.Store(false)
	_, err := f.execute(key)
	require.ErrorIs(t, err, idem.ErrNeedsReconcile)
}

func (f *resolveFixture) row(t *testing.T, key string) string {
	t.Helper()
	var row string
	require.NoError(t, f.schema.Pool.QueryRow(context.Background(), `
		SELECT row_to_json(k)::text || coalesce(row_to_json(l)::text, '')
		FROM idem_keys k LEFT JOIN idem_leases l ON l.scope = k.scope AND l.key_id = k.id WHERE k.key = $1`, key).Scan(&row))
	return row
}

// The generic idem binary (no flows) resolves keys by hand: a dry run
// changes nothing, each verdict does what it says, and the application's
// retries see it.
func TestKeysResolve(t *testing.T) {
	t.Parallel()
	f := newResolveFixture(t)
	for _, k := range []string{"answered", "again", "dropped", "resumed"} {
		f.inDoubt(t, k)
	}
	resolve := func(cfg *Config, args ...string) (string, string, int) {
		return runDB(t, f.schema, cfg, append([]string{"keys", "resolve"}, args...)...)
	}
	who := []string{"--scope", "s", "--operator", "alice", "--reason", "INC-42: checked the gateway log"}

	// Usage errors, before any connection.
	for _, args := range [][]string{
		{"answered", "--scope", "s", "--verdict", "happened"},                           // no operator, no reason
		append([]string{"answered", "--verdict", "maybe"}, who...),                      // bad verdict
		append([]string{"answered", "--verdict", "abandon", "--status", "201"}, who...), // an answer with abandon
		append([]string{"answered", "--verdict", "happened", "--body", "{}"}, who...),   // a body without a status
		append([]string{"answered", "--verdict", "happened", "--status", "99"}, who...), // a bad status
		append([]string{"answered", "--verdict", "happened", "--status", "201", "--body", "@/nonexistent"}, who...),
		{"answered", "--scope", "s", "--verdict", "abandon", "--operator", "x", "--reason", "x"}, // a reason that says nothing
	} {
		_, stderr, code := resolve(nil, args...)
		require.Equal(t, ExitUsage, code, "%v: %s", args, stderr)
	}

	before := f.row(t, "answered")
	stdout, stderr, code := resolve(nil, append([]string{"answered", "--verdict", "abandon", "--dry-run"}, who...)...)
	t.Logf("dry run: exit %d: %s%s", code, stdout, stderr)
	require.Equal(t, ExitOK, code, stderr)
	require.Contains(t, stdout, "dry run, nothing changed")
	require.Contains(t, stdout, "would finish the key as abandoned")
	require.Equal(t, before, f.row(t, "answered"))

	// happened, resuming: this binary does not know whether the phase is the last.
	stdout, stderr, code = resolve(nil, append([]string{"resumed", "--verdict", "happened"}, who...)...)
	t.Logf("happened without the flow: exit %d: %s%s", code, stdout, stderr)
	require.Equal(t, ExitFailure, code)
	require.Contains(t, stderr, "give the answer the flow would have stored")

	// happened, with the answer.
	answer := filepath.Join(t.TempDir(), "answer.json")
	require.NoError(t, os.WriteFile(answer, []byte(`{"sms":"sent by hand"}`), 0o600))
	stdout, stderr, code = resolve(nil, append([]string{"answered", "--verdict", "happened", "--status", "201", "--body", "@" + answer}, who...)...)
	t.Logf("happened with an answer: exit %d: %s%s", code, stdout, stderr)
	require.Equal(t, ExitOK, code, stderr)
	out, err := f.execute("answered")
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeReplayed, out.Kind)
	require.Equal(t, 201, out.Response.Status)
	require.JSONEq(t, `{"sms":"sent by hand"}`, string(out.Response.Body))
	require.Equal(t, "application/json", out.Response.Header.Get("Content-Type"))

	// not happened: refused without --confirm, saying what it would do;
	// confirmed, the retry sends.
	before = f.row(t, "again")
	stdout, stderr, code = resolve(nil, append([]string{"again", "--verdict", "not-happened"}, who...)...)
	t.Logf("not happened, unconfirmed: exit %d: %s%s", code, stdout, stderr)
	require.Equal(t, ExitFailure, code)
	require.Contains(t, stderr, `the call of phase "sent" will be made again; if it did happen, it happens twice`)
	require.Contains(t, stderr, "--confirm")
	require.Equal(t, before, f.row(t, "again"))
	stdout, stderr, code = resolve(nil, append([]string{"again", "--verdict", "not-happened", "--confirm"}, who...)...)
	t.Logf("not happened: exit %d: %s%s", code, stdout, stderr)
	require.Equal(t, ExitOK, code, stderr)
	out, err = f.execute("again")
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.EqualValues(t, 1, f.sends.Load())

	// abandon, in JSON.
	stdout, stderr, code = resolve(nil, append([]string{"dropped", "--verdict", "abandon", "--json"}, who...)...)
	t.Logf("abandon: exit %d: %s%s", code, stdout, stderr)
	require.Equal(t, ExitOK, code, stderr)
	var printed struct {
		Verdict string `json:"verdict"`
		DryRun  bool   `json:"dry_run"`
		Key     struct {
			Status        string `json:"status"`
			RecoveryPoint string `json:"recovery_point"`
			LastError     string `json:"last_error"`
		} `json:"key"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &printed))
	require.Equal(t, "abandon", printed.Verdict)
	require.False(t, printed.DryRun)
	require.Equal(t, idemtype.RecoveryPointAbandoned, printed.Key.RecoveryPoint)
	require.Contains(t, printed.Key.LastError, "resolved by alice: abandon: INC-42: checked the gateway log")
	_, err = f.execute("dropped")
	require.ErrorIs(t, err, idem.ErrRequestAbandoned)

	// The application's CLI, which has the flow, resumes at the next phase.
	stdout, stderr, code = resolve(&Config{Flows: []idem.AnyFlow{f.flow}}, append([]string{"resumed", "--verdict", "happened"}, who...)...)
	t.Logf("happened with the flow: exit %d: %s%s", code, stdout, stderr)
	require.Equal(t, ExitOK, code, stderr)
	out, err = f.execute("resumed")
	require.NoError(t, err)
	require.Equal(t, idem.OutcomeExecuted, out.Kind)
	require.EqualValues(t, 1, f.sends.Load(), "the send was not repeated")

	// Keys in other states, and keys that do not exist.
	before = f.row(t, "again")
	stdout, stderr, code = resolve(nil, append([]string{"again", "--verdict", "abandon"}, who...)...)
	t.Logf("a finished key: exit %d: %s%s", code, stdout, stderr)
	require.Equal(t, ExitFailure, code)
	require.Contains(t, stderr, "only a key in needs_reconcile can be resolved")
	require.Equal(t, before, f.row(t, "again"))
	_, _, code = resolve(nil, append([]string{"nope", "--verdict", "abandon"}, who...)...)
	require.Equal(t, ExitNotFound, code)
}
