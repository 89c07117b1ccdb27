package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
	"github.com/go-idem/idem/idemtype"
)

// refusedURL is the address of a port nobody listens on: one the system
// just handed out and that was closed again, so a connection to it is
// refused before a byte of the request is written.
func refusedURL(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf("http://127.0.0.1:%d", refusedPort(t))
}

// postLedger posts one entry to a ledger that has no idempotency keys,
// over real HTTP. An error that proves the request never left (the
// connection could not be made) is wrapped with idem.NotSent; any other
// may have reached the ledger.
func postLedger(ctx context.Context, url, ref string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/entries", strings.NewReader(`{"ref":"`+ref+`"}`))
	if err != nil {
		return idem.NotSent(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		if op := (*net.OpError)(nil); errors.As(err, &op) && op.Op == "dial" {
			return idem.NotSent(err)
		}
		return err
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, res.Body)
	if res.StatusCode != http.StatusCreated {
		return fmt.Errorf("ledger answered %d", res.StatusCode)
	}
	return nil
}

// A not-idempotent call refused before it was written (the ledger's port
// is closed) is not in doubt: the phase rolls back, the mark is withdrawn,
// the client gets the retryable answer of a failed phase, and nothing goes
// to reconciliation; the retry, once the ledger is up, posts the entry
// once.
func TestNotSentCallIsRetriedNotReconciled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	var entries atomic.Int32
	ledger := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entries.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(ledger.Close)
	var ledgerURL atomic.Value
	ledgerURL.Store(refusedURL(t))

	var reconciles atomic.Int32
	flow := idem.MustNewFlow("transfers.create", []idem.Phase[rideInput]{{
		Name:    "posted",
		Foreign: idem.ForeignNotIdempotent,
		Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) (idem.Result, error) {
			if err := run.Foreign(ctx, "post_entry", func(ctx context.Context, key string) error {
				return postLedger(ctx, ledgerURL.Load().(string), key)
			}); err != nil {
				return idem.Result{}, err
			}
			return idem.RespondJSON(http.StatusCreated, map[string]string{"status": "posted"}), nil
		},
		Reconcile: func(context.Context, idem.Tx, *idem.Attempt[rideInput]) (idem.ReconcileVerdict, error) {
			reconciles.Add(1)
			return idem.ReconcileUnknown("the ledger cannot be asked"), nil
		},
	}}, nil)
	runner := b.runner(t, &idem.Config{Flows: []idem.AnyFlow{flow}})
	h, err := idemhttp.New(runner, flow, &idemhttp.Config[rideInput]{
		Scope: func(*http.Request) (string, error) { return "user:1", nil },
	})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	post := func() (int, string) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/transfers", strings.NewReader(`{"origin":"a","amount":5}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "t1")
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(body)
	}

	status, body := post()
	t.Logf("ledger refused: %d %s", status, body)
	require.Equal(t, http.StatusInternalServerError, status, "the retryable answer of a failed phase: %s", body)
	rec := b.key(t, "t1")
	t.Logf("key after the refused call: status=%s recovery_point=%s mark=%q locked=%v last_error=%q",
		rec.Status, rec.RecoveryPoint, rec.ForeignMark, rec.LockedAt != nil, rec.LastError)
	require.Equal(t, idemtype.StoredRunning, rec.Status, "not sent is not in doubt")
	require.Empty(t, rec.ForeignMark, "the mark is withdrawn")
	require.Nil(t, rec.LockedAt, "the key is released for the retry")
	require.Contains(t, rec.LastError, "not sent")

	res, err := runner.ReconcileAll(ctx, nil)
	require.NoError(t, err)
	require.Zero(t, res.Claimed, "nothing to reconcile")
	require.Zero(t, reconciles.Load())

	ledgerURL.Store(ledger.URL)
	status, body = post()
	t.Logf("ledger up: %d %s", status, body)
	require.Equal(t, http.StatusCreated, status, body)
	require.EqualValues(t, 1, entries.Load())
	require.Zero(t, reconciles.Load())
}

func TestNotSentOfNilIsNil(t *testing.T) {
	t.Parallel()
	require.NoError(t, idem.NotSent(nil))
	cause := errors.New("dial tcp: connection refused")
	err := idem.NotSent(cause)
	require.ErrorIs(t, err, idem.ErrNotSent)
	require.ErrorIs(t, err, cause)
}
