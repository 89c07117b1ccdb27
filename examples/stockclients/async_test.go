package stockclients_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/examples/stockclients"
	"github.com/go-idem/idem/idemhttp"
)

// asyncCharge is one charge sent with Prefer: respond-async, and what its
// 202 said.
type asyncCharge struct {
	order    string
	key      string
	location string
}

// postAsync sends order's charge as account, preferring respond-async,
// straight to the server, and returns its answer.
func (e *env) postAsync(t *testing.T, account, order, key string) *http.Response {
	t.Helper()
	body, err := json.Marshal(stockclients.ChargeParams{Amount: 1000, Currency: "usd", Metadata: map[string]string{"order_id": order}})
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, "http://"+e.addr+"/v1/charges", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+account)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Prefer", "respond-async")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	return res
}

// monitorPoller is go-retryablehttp polling a status monitor, as
// docs/http.md's "Long requests" recipe configures it.
func monitorPoller() *retryablehttp.Client {
	poller := retryablehttp.NewClient()
	poller.RetryMax = 120
	// 202: not yet; poll again. The rest as the default policy (connection errors, 429, 5xx).
	poller.CheckRetry = func(ctx context.Context, res *http.Response, err error) (bool, error) {
		if err == nil && res.StatusCode == http.StatusAccepted {
			return true, nil
		}
		return retryablehttp.DefaultRetryPolicy(ctx, res, err)
	}
	// After a 202's Retry-After; the rest with the default backoff.
	poller.Backoff = func(min, max time.Duration, attempt int, res *http.Response) time.Duration {
		if res != nil && res.StatusCode == http.StatusAccepted {
			if secs, err := strconv.Atoi(res.Header.Get("Retry-After")); err == nil {
				return time.Duration(secs) * time.Second
			}
		}
		return retryablehttp.DefaultBackoff(min, max, attempt, res)
	}
	poller.Logger = nil
	return poller
}

// get GETs url as account with client (which must be its own) and returns
// the final status, body and how many requests the client made.
func get(t *testing.T, client *retryablehttp.Client, url, account string) (int, []byte, int) {
	t.Helper()
	req, err := retryablehttp.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+account)
	polls := 0 // the client's own count of the requests it made
	client.RequestLogHook = func(retryablehttp.Logger, *http.Request, int) { polls++ }
	res, err := client.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, body, polls
}

// 50 charges sent with Prefer: respond-async are answered 202; the server
// is killed with SIGKILL while some of them wait on the card network, and
// a new process (its Maintainer's completer running) starts. go-retryablehttp,
// polling every monitor URL as the recipe says, ends on each charge's
// stored answer; each order is charged once, and has one charge row; a
// monitor URL used with another account's credentials is 404.
func TestRespondAsyncKilled(t *testing.T) {
	t.Parallel()
	const n, held = 50, 6
	e := setupWith(t, serverOptions{poolConns: 14, holdFirst: held})
	charges := make([]asyncCharge, n)
	var wg sync.WaitGroup
	for i := range charges {
		c := &charges[i]
		c.order, c.key = fmt.Sprintf("async-%d", i), rand.Text()
		wg.Go(func() {
			res := e.postAsync(t, "sk_test_carol", c.order, c.key)
			defer res.Body.Close()
			require.Equal(t, http.StatusAccepted, res.StatusCode)
			require.Equal(t, "respond-async", res.Header.Get("Preference-Applied"))
			require.Equal(t, "1", res.Header.Get("Retry-After"))
			c.location = res.Header.Get("Location")
			require.Equal(t, stockclients.MonitorURL+"?key="+c.key, c.location)
		})
	}
	wg.Wait()
	require.Eventually(t, func() bool { return e.card.held.Load() == held }, time.Minute, 10*time.Millisecond,
		"%d charges wait on the card network", held)
	var unfinished int
	require.NoError(t, e.schema.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM idem_keys WHERE status <> 'finished'`).Scan(&unfinished))
	require.GreaterOrEqual(t, unfinished, held)

	e.restart(t) // SIGKILL while they run, and a new process
	e.openGate()

	statuses := map[int]int{}
	var mu sync.Mutex
	totalPolls := 0
	for i := range charges {
		c := &charges[i]
		wg.Go(func() {
			status, body, polls := get(t, monitorPoller(), "http://"+e.addr+c.location, "sk_test_carol")
			require.Equal(t, http.StatusOK, status, "%s: %s", c.order, body)
			var charge struct {
				Object   string            `json:"object"`
				Status   string            `json:"status"`
				Metadata map[string]string `json:"metadata"`
			}
			require.NoError(t, json.Unmarshal(body, &charge))
			require.Equal(t, "succeeded", charge.Status)
			require.Equal(t, c.order, charge.Metadata["order_id"], "the monitor answers its own request")
			mu.Lock()
			defer mu.Unlock()
			statuses[status]++
			totalPolls += polls
		})
	}
	wg.Wait()

	notFound := 0
	for _, c := range charges {
		req, err := http.NewRequest(http.MethodGet, "http://"+e.addr+c.location, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer sk_test_mallory")
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var p struct {
			Type string `json:"type"`
		}
		require.NoError(t, json.NewDecoder(res.Body).Decode(&p))
		_ = res.Body.Close()
		require.Equal(t, http.StatusNotFound, res.StatusCode, "another account's monitor URL")
		require.Equal(t, idemhttp.ProblemTypeBaseDefault+idemhttp.ProblemRequestNotFound, p.Type)
		notFound++
	}

	e.settle(t)
	once := 0
	for _, c := range charges {
		var rows int
		require.NoError(t, e.schema.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM charges WHERE order_id = $1 AND status = 'succeeded'`, c.order).Scan(&rows))
		require.Equal(t, 1, rows, "%s: one charge row", c.order)
		require.Equal(t, 1, e.card.charges(c.order), "%s: charged once by the card network", c.order)
		once++
	}
	t.Logf("respond-async: %d charges answered 202; %d held at the card network, %d keys unfinished when the server was killed (SIGKILL, %d kill); "+
		"go-retryablehttp v0.7.8 polling the monitor URLs after the restart: %d of %d ended on the stored 200 (%d requests in all); "+
		"%d of %d monitor URLs with another account's credentials: 404; %d of %d orders charged exactly once (card network ledger and charge rows); "+
		"card network failed %d calls, lost %d answers",
		n, held, unfinished, e.kills, statuses[http.StatusOK], n, totalPolls, notFound, n, once, n, e.card.failed.Load(), e.card.dropped.Load())
}

// With the process's bound of runs without a client full, a charge that
// prefers respond-async is answered as without it (its client waits for
// the charge) and the answer says why; those within the bound end on
// their stored answer.
func TestRespondAsyncBound(t *testing.T) {
	t.Parallel()
	const limit = 3
	e := setupWith(t, serverOptions{detached: limit, poolConns: 10, holdFirst: 1000})
	locations := make([]string, limit)
	for i := range limit {
		res := e.postAsync(t, "sk_test_dave", fmt.Sprintf("bound-%d", i), rand.Text())
		_ = res.Body.Close()
		require.Equal(t, http.StatusAccepted, res.StatusCode)
		locations[i] = res.Header.Get("Location")
	}
	require.Eventually(t, func() bool { return e.card.held.Load() == limit }, time.Minute, 10*time.Millisecond)

	beyond := make(chan *http.Response, 1)
	go func() { beyond <- e.postAsync(t, "sk_test_dave", "bound-beyond", rand.Text()) }()
	require.Eventually(t, func() bool { return e.card.held.Load() == limit+1 }, time.Minute, 10*time.Millisecond,
		"the request beyond the bound runs while its client waits")
	select {
	case <-beyond:
		t.Fatal("the request beyond the bound was answered before its charge ended")
	default:
	}
	e.openGate()
	res := <-beyond
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode, "answered as today: %s", body)
	require.Equal(t, "declined; reason=busy", res.Header.Get(idemhttp.AsyncHeader))
	require.Empty(t, res.Header.Get("Preference-Applied"))

	ended := 0
	for _, location := range locations {
		status, body, _ := get(t, monitorPoller(), "http://"+e.addr+location, "sk_test_dave")
		require.Equal(t, http.StatusOK, status, string(body))
		ended++
	}
	t.Logf("bound of %d runs without a client: %d charges answered 202, the next answered %d with %s: %q and no Preference-Applied; "+
		"%d of %d monitor URLs ended on the stored 200",
		limit, limit, res.StatusCode, idemhttp.AsyncHeader, res.Header.Get(idemhttp.AsyncHeader), ended, limit)
}
