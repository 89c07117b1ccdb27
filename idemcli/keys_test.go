package idemcli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/pgstore"
)

// keys show --id finds a key by the key_id its log lines carry, without
// its scope; it excludes KEY and --scope.
func TestKeysShowByID(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewMigratedSchema(t)
	finishPayment(t, schema, "tenant:1", "k1")
	finishPayment(t, schema, "tenant:2", "k2")
	var id int64
	require.NoError(t, schema.Pool.QueryRow(context.Background(), `SELECT id FROM idem_keys WHERE key = 'k2'`).Scan(&id))

	stdout, stderr, code := runDB(t, schema, nil, "keys", "show", "--id", fmt.Sprint(id))
	t.Logf("keys show --id %d: exit %d\n%s", id, code, stdout)
	require.Equal(t, ExitOK, code, stderr)
	require.Regexp(t, `(?m)^key +k2$`, stdout)
	require.Contains(t, stdout, "tenant:2")

	_, _, code = runDB(t, schema, nil, "keys", "show", "--id", "999999")
	require.Equal(t, ExitNotFound, code)
	for _, args := range [][]string{{"keys", "show"}, {"keys", "show", "k1"}, {"keys", "show", "k1", "--scope", "tenant:1", "--id", "1"}, {"keys", "show", "--id", "-1"}} {
		_, stderr, code := runDB(t, schema, nil, args...)
		require.Equal(t, ExitUsage, code, "%v: %s", args, stderr)
	}
}

// keys list offers older keys (--before-id) only when there are some.
func TestKeysListOffersOlderOnesOnlyWhenThereAreSome(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewMigratedSchema(t)
	for i := range 3 {
		finishPayment(t, schema, "tenant:1", fmt.Sprintf("k%d", i))
	}
	stdout, stderr, code := runDB(t, schema, nil, "keys", "list", "--scope", "tenant:1")
	require.Equal(t, ExitOK, code, stderr)
	t.Logf("all on one page:\n%s", stdout)
	require.NotContains(t, stdout, "--before-id")

	stdout, stderr, code = runDB(t, schema, nil, "keys", "list", "--scope", "tenant:1", "--limit", "2")
	require.Equal(t, ExitOK, code, stderr)
	t.Logf("a page of two:\n%s", stdout)
	require.Contains(t, stdout, "older ones: --before-id")
	last := stdout[strings.LastIndex(stdout, "--before-id ")+len("--before-id "):]
	stdout, stderr, code = runDB(t, schema, nil, "keys", "list", "--scope", "tenant:1", "--limit", "2", "--before-id", strings.TrimSpace(last))
	require.Equal(t, ExitOK, code, stderr)
	require.Contains(t, stdout, "k0")
	require.NotContains(t, stdout, "--before-id", "the last page")
}

// keys show names a held key's holder (instance, host, pid, boot), in text
// and JSON, and says what a live lease means when its holder has died.
func TestKeysShowNamesTheLeaseHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewMigratedSchema(t)
	store, err := pgstore.New(schema.Pool, &pgstore.Config{Instance: "web-1"})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	res, err := store.Acquire(ctx, idemdriver.AcquireParams{Scope: "tenant:1", Key: "held", Flow: "f", Method: "POST", Path: "/",
		Fingerprints: [][]byte{[]byte{1}}, Params: []byte("{}"), Lease: time.Hour})
	require.NoError(t, err)
	rec := res.Record

	stdout, stderr, code := runDB(t, schema, nil, "keys", "show", "held", "--scope", "tenant:1")
	t.Logf("keys show of a held key:\n%s", stdout)
	require.Equal(t, ExitOK, code, stderr)
	require.Regexp(t, fmt.Sprintf(`(?m)^holder +instance web-1, host %s, pid %d, boot %s`, regexp.QuoteMeta(rec.HolderHost), rec.HolderPID, rec.HolderBoot), stdout)
	require.Regexp(t, `(?m)^lease expires +\S+ \(live: `, stdout)

	stdout, stderr, code = runDB(t, schema, nil, "keys", "show", "held", "--scope", "tenant:1", "--json")
	require.Equal(t, ExitOK, code, stderr)
	var j struct {
		HolderInstance string `json:"holder_instance"`
		HolderPID      int    `json:"holder_pid"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &j))
	require.Equal(t, "web-1", j.HolderInstance)
	require.Equal(t, os.Getpid(), j.HolderPID)

	// A key whose lease no recorded holder took.
	_, err = schema.Pool.Exec(ctx, `UPDATE idem_leases SET holder_fence = NULL;
		UPDATE idem_keys SET holder_instance = NULL, holder_host = NULL, holder_pid = NULL, holder_boot = NULL`)
	require.NoError(t, err)
	stdout, _, code = runDB(t, schema, nil, "keys", "show", "held", "--scope", "tenant:1")
	require.Equal(t, ExitOK, code)
	require.Regexp(t, `(?m)^holder +- \(not recorded`, stdout)
}
