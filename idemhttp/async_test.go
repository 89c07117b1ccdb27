package idemhttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
	"github.com/go-idem/idem/idemtype"
)

const monitorURL = "/rides/requests"

// asyncHandler is the rides handler answering Prefer: respond-async, with
// a DetachedRuns of its own of limit runs.
func (b *bundle) asyncHandler(t testing.TB, limit int, adjust func(*idemhttp.Config[rideInput])) (*idemhttp.Handler[rideInput], *idemhttp.DetachedRuns) {
	t.Helper()
	detached := idemhttp.NewDetachedRuns(limit)
	return b.handler(t, func(c *idemhttp.Config[rideInput]) {
		c.RespondAsync, c.MonitorURL, c.Detached = true, monitorURL, detached
		if adjust != nil {
			adjust(c)
		}
	}), detached
}

// postAsync posts a ride as alice, preferring respond-async.
func postAsync(h http.Handler, key string) *httptest.ResponseRecorder {
	r := request(key, rideBody)
	r.Header.Set("Prefer", "respond-async")
	return serve(h, r)
}

// poll GETs the status monitor URL as the caller authorized by auth.
func poll(h *idemhttp.Handler[rideInput], location, auth string) *httptest.ResponseRecorder {
	r := requestTo(http.MethodGet, location, "", "")
	r.Header.Set("Authorization", auth)
	return serve(h.Monitor(), r)
}

func decodeStatus(t *testing.T, res *httptest.ResponseRecorder) idemhttp.RequestStatus {
	t.Helper()
	require.Equal(t, "application/json", res.Header().Get("Content-Type"))
	var s idemhttp.RequestStatus
	require.NoError(t, json.Unmarshal(res.Body.Bytes(), &s), res.Body.String())
	return s
}

// blockUntilCanceled makes the first run of phase signal entered and then
// wait for its context to end: a run that nothing stops never returns.
func (b *bundle) blockUntilCanceled(t testing.TB, phase string) (entered <-chan struct{}, release func()) {
	in, out := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b.setHook(phase, func(ctx context.Context, _ idem.Tx, _ *idem.Attempt[rideInput]) error {
		first := false
		once.Do(func() { first = true })
		if !first {
			return nil
		}
		close(in)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-out:
			return nil
		}
	})
	release = sync.OnceFunc(func() { close(out) })
	t.Cleanup(release)
	return in, release
}

// A request that prefers respond-async is answered 202 once its key is
// held, with Preference-Applied, the monitor's Location, Retry-After and
// its status; its flow goes on without it. A retry while it runs gets the
// same 202, the monitor 202 with the recovery point, another caller 404;
// once it ended, the monitor and every retry get the stored response.
func TestRespondAsync(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	h, detached := b.asyncHandler(t, 10, func(c *idemhttp.Config[rideInput]) { c.ShowRecoveryPoint = true })
	entered, release := b.blockPhase(t, "charge_created")

	res := postAsync(h, "k/1 &")
	require.Equal(t, http.StatusAccepted, res.Code, res.Body.String())
	location := monitorURL + "?key=k%2F1+%26"
	require.Equal(t, "respond-async", res.Header().Get("Preference-Applied"))
	require.Equal(t, location, res.Header().Get("Location"))
	require.Equal(t, "1", res.Header().Get("Retry-After"))
	require.Equal(t, "k/1 &", res.Header().Get("Idempotency-Key"))
	require.Equal(t, idemhttp.RequestStatus{Status: "running", RecoveryPoint: "started", Monitor: location}, decodeStatus(t, res))
	<-entered
	require.Equal(t, 1, detached.Running(), "the flow runs on without its client")

	again := postAsync(h, "k/1 &")
	require.Equal(t, http.StatusAccepted, again.Code, "a retry while it runs: the same 202, not 409: %s", again.Body)
	require.Equal(t, "respond-async", again.Header().Get("Preference-Applied"))
	require.Equal(t, location, again.Header().Get("Location"))
	require.Equal(t, "ride_created", decodeStatus(t, again).RecoveryPoint)
	plain := post(h, "k/1 &", rideBody)
	require.Equal(t, http.StatusConflict, plain.Code, "without the preference, the handler's in-progress answer")

	running := poll(h, location, testAuth)
	require.Equal(t, http.StatusAccepted, running.Code, running.Body.String())
	require.Equal(t, "1", running.Header().Get("Retry-After"))
	require.Equal(t, "no-store", running.Header().Get("Cache-Control"))
	require.Empty(t, running.Header().Get("Preference-Applied"))
	require.Equal(t, idemhttp.RequestStatus{Status: "running", RecoveryPoint: "ride_created", Monitor: location}, decodeStatus(t, running))

	other := poll(h, location, "Bearer bob")
	require.Equal(t, http.StatusNotFound, other.Code, "another caller's key is not found: %s", other.Body)
	require.Equal(t, idemhttp.ProblemTypeBaseDefault+idemhttp.ProblemRequestNotFound, decodeProblem(t, other).Type)

	release()
	require.Eventually(t, func() bool { return detached.Running() == 0 }, 30*time.Second, 10*time.Millisecond)
	done := poll(h, location, testAuth)
	require.Equal(t, http.StatusCreated, done.Code, done.Body.String())
	require.Equal(t, "true", done.Header().Get("Idempotent-Replayed"))
	require.Equal(t, "application/json", done.Header().Get("Content-Type"))
	require.NotEmpty(t, done.Header().Get("Location"), "the flow's replayed headers")
	require.Equal(t, "no-store", done.Header().Get("Cache-Control"),
		"the URL is the same for every tenant that uses the key: no cache may keep one's answer for another")
	replay := postAsync(h, "k/1 &")
	require.Equal(t, http.StatusCreated, replay.Code)
	require.Equal(t, done.Body.Bytes(), replay.Body.Bytes())
	require.Empty(t, replay.Header().Get("Preference-Applied"), "a finished request is answered, not accepted")
	b.requireFinished(t, "k/1 &", done)
}

// Without RespondAsync the preference is ignored; "respond-async, wait=N"
// is answered the response itself when the flow ends within N seconds.
func TestRespondAsyncIgnoredOrAnsweredInTime(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	res := postAsync(b.handler(t, nil), "k-1")
	require.Equal(t, http.StatusCreated, res.Code, res.Body.String())
	require.Empty(t, res.Header().Get("Preference-Applied"))

	h, _ := b.asyncHandler(t, 10, func(c *idemhttp.Config[rideInput]) { c.MaxWait = time.Minute })
	r := request("k-2", rideBody)
	r.Header.Set("Prefer", "respond-async, wait=60")
	res = serve(h, r)
	require.Equal(t, http.StatusCreated, res.Code, "the flow ended within the wait: %s", res.Body)
	require.Empty(t, res.Header().Get("Preference-Applied"))
}

// InProgressAccepted answers a key in flight 202 with Retry-After and the
// monitor's Location, whatever the request preferred; the default is 409.
func TestInProgressAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	h := b.handler(t, func(c *idemhttp.Config[rideInput]) {
		c.InProgress, c.MonitorURL, c.AsyncRetryAfter = idemhttp.InProgressAccepted, monitorURL, 1500*time.Millisecond
	})
	entered, release := b.blockPhase(t, "charge_created")
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- post(h, "k-1", rideBody) }()
	<-entered
	res := post(h, "k-1", rideBody)
	require.Equal(t, http.StatusAccepted, res.Code, res.Body.String())
	require.Equal(t, "2", res.Header().Get("Retry-After"), "whole seconds, rounded up")
	require.Equal(t, monitorURL+"?key=k-1", res.Header().Get("Location"))
	require.Empty(t, res.Header().Get("Preference-Applied"), "it preferred nothing")
	require.Equal(t, idemhttp.RequestStatus{Status: "running", Monitor: monitorURL + "?key=k-1"}, decodeStatus(t, res),
		"no recovery point unless ShowRecoveryPoint")
	release()
	require.Equal(t, http.StatusCreated, (<-first).Code)
}

// Beyond Config.Detached, a request that prefers respond-async runs while
// its client waits, as without the preference, and the answer says why.
func TestRespondAsyncBeyondTheBound(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	h, detached := b.asyncHandler(t, 1, nil)
	entered, release := b.blockPhase(t, "charge_created")
	require.Equal(t, http.StatusAccepted, postAsync(h, "k-1").Code)
	<-entered
	res := postAsync(h, "k-2")
	require.Equal(t, http.StatusCreated, res.Code, "answered as today: %s", res.Body)
	require.Equal(t, "declined; reason=busy", res.Header().Get(idemhttp.AsyncHeader))
	require.Empty(t, res.Header().Get("Preference-Applied"))
	require.Equal(t, 1, detached.Running())
	require.Equal(t, 1, detached.Limit())
	release()
	require.Eventually(t, func() bool { return detached.Running() == 0 }, 30*time.Second, 10*time.Millisecond)
	room := postAsync(h, "k-3")
	require.Empty(t, room.Header().Get(idemhttp.AsyncHeader), "room again")
	require.Contains(t, []int{http.StatusAccepted, http.StatusCreated}, room.Code, "202, or the response when the flow ended first")
}

// A run whose client went away counts against Config.Detached while it
// runs on; one beyond the bound is stopped, and its key left unfinished
// for a retry or the completer, which finishes it.
func TestClientLeftRunsAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	detached := idemhttp.NewDetachedRuns(1)
	h := b.handler(t, func(c *idemhttp.Config[rideInput]) { c.Detached = detached })

	leave := func(key string) (<-chan *httptest.ResponseRecorder, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan *httptest.ResponseRecorder, 1)
		go func() { done <- serve(h, request(key, rideBody).WithContext(ctx)) }()
		return done, cancel
	}
	entered, release := b.blockUntilCanceled(t, "charge_created")
	first, leaveFirst := leave("k-1")
	<-entered
	require.Zero(t, detached.Running(), "its client still waits")
	leaveFirst()
	require.Eventually(t, func() bool { return detached.Running() == 1 }, 30*time.Second, 10*time.Millisecond,
		"the client left: it runs on, counted")

	// The bound is full: the next run whose client leaves is stopped.
	entered2, _ := b.blockUntilCanceled(t, "ride_created")
	second, leaveSecond := leave("k-2")
	<-entered2
	leaveSecond()
	require.Equal(t, idemhttp.StatusClientClosedRequest, (<-second).Code, "stopped: nothing stored")
	row := b.keyRow(t, "k-2")
	require.Equal(t, idemtype.StoredRunning, row.Status)
	require.Nil(t, row.LockedAt, "the key is released")

	release()
	require.Equal(t, http.StatusCreated, (<-first).Code, "the first ran to the end")
	require.Zero(t, detached.Running())
	b.clock.Advance(idem.CompleteIdleForDefault + 1)
	done, err := b.runner.Complete(context.Background(), nil)
	require.NoError(t, err)
	require.Equal(t, 1, done.Completed, "the completer finishes the stopped one")
	require.Equal(t, idemtype.StoredFinished, b.keyRow(t, "k-2").Status)
}

// The status monitor's answer in each state of a key, and to requests it
// refuses: needs reconcile 503, abandoned 410, expired, unknown or another
// endpoint's key 404, a missing or bad key 400, no caller 401, POST 405.
func TestMonitorStates(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	ctx := context.Background()
	sms, err := idemhttp.New(b.runner, b.sms, &idemhttp.Config[smsInput]{Scope: bearerScope, MonitorURL: "/sms/requests", DefaultWait: -1})
	require.NoError(t, err)
	monitor := sms.Monitor()
	get := func(target, auth string) *httptest.ResponseRecorder {
		r := requestTo(http.MethodGet, target, "", "")
		r.Header.Set("Authorization", auth)
		return serve(monitor, r)
	}
	requireProblem := func(res *httptest.ResponseRecorder, status int, name string) {
		t.Helper()
		require.Equal(t, status, res.Code, res.Body.String())
		require.Equal(t, idemhttp.ProblemTypeBaseDefault+name, decodeProblem(t, res).Type)
		require.Equal(t, "no-store", res.Header().Get("Cache-Control"))
	}

	first := post(sms, "s-1", `{"to": "+15550100"}`)
	require.Equal(t, http.StatusServiceUnavailable, first.Code, first.Body.String())
	res := get("/sms/requests?key=s-1", testAuth)
	requireProblem(res, http.StatusServiceUnavailable, idemhttp.ProblemNeedsReconcile)
	require.Equal(t, "60", res.Header().Get("Retry-After"))

	_, err = b.runner.Resolve(ctx, testScope, "s-1", idem.Resolution{Verdict: idem.ResolveAbandon, Operator: "alice", Reason: "refunded by hand"})
	require.NoError(t, err)
	requireProblem(get("/sms/requests?key=s-1", testAuth), http.StatusGone, idemhttp.ProblemRequestAbandoned)

	rides := b.handler(t, func(c *idemhttp.Config[rideInput]) { c.MonitorURL = monitorURL })
	require.Equal(t, http.StatusCreated, post(rides, "r-1", rideBody).Code)
	require.Equal(t, http.StatusCreated, poll(rides, monitorURL+"?key=r-1", testAuth).Code)
	requireProblem(get("/sms/requests?key=r-1", testAuth), http.StatusNotFound, idemhttp.ProblemRequestNotFound)
	requireProblem(get("/sms/requests?key=nope", testAuth), http.StatusNotFound, idemhttp.ProblemRequestNotFound)
	b.clock.Advance(25 * time.Hour) // past the default retention
	requireProblem(poll(rides, monitorURL+"?key=r-1", testAuth), http.StatusNotFound, idemhttp.ProblemRequestNotFound)

	// A request whose attempt failed waits, unlocked, for its retry or the
	// completer: running, for its client.
	b.failOnce("charge_created", func() error { return errors.New("provider timed out") })
	require.Equal(t, http.StatusInternalServerError, post(rides, "r-2", rideBody).Code)
	require.Nil(t, b.keyRow(t, "r-2").LockedAt)
	stale := poll(rides, monitorURL+"?key=r-2", testAuth)
	require.Equal(t, http.StatusAccepted, stale.Code, stale.Body.String())
	require.Equal(t, "1", stale.Header().Get("Retry-After"))
	require.Equal(t, "running", decodeStatus(t, stale).Status)
	head := requestTo(http.MethodHead, monitorURL+"?key=r-2", "", "")
	require.Equal(t, http.StatusAccepted, serve(rides.Monitor(), head).Code, "HEAD as GET")

	requireProblem(get("/sms/requests", testAuth), http.StatusBadRequest, idemhttp.ProblemKeyMissing)
	requireProblem(get("/sms/requests?key=a&key=b", testAuth), http.StatusBadRequest, idemhttp.ProblemKeyMalformed)
	requireProblem(get("/sms/requests?key=%00", testAuth), http.StatusBadRequest, idemhttp.ProblemKeyMalformed)
	requireProblem(get("/sms/requests?key=s-1", ""), http.StatusUnauthorized, idemhttp.ProblemUnauthenticated)
	res = serve(monitor, requestTo(http.MethodPost, "/sms/requests?key=s-1", "", ""))
	requireProblem(res, http.StatusMethodNotAllowed, idemhttp.ProblemMethodNotAllowed)
	require.Equal(t, "GET, HEAD", res.Header().Get("Allow"))
}

// New refuses RespondAsync without a MonitorURL, and for a flow the
// completer does not re-drive, whose 202 would never finish if its
// process died.
func TestRespondAsyncConfig(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	cfg := b.config()
	cfg.RespondAsync = true
	_, err := idemhttp.New(b.runner, b.flow, cfg)
	require.ErrorContains(t, err, "RespondAsync needs MonitorURL")
	cfg.MonitorURL = "relative/path"
	_, err = idemhttp.New(b.runner, b.flow, cfg)
	require.ErrorContains(t, err, "MonitorURL")

	stays := b.rideFlow(&idem.FlowConfig[rideInput]{NoRedrive: true})
	runner, err := idem.NewRunner(b.store, &idem.Config{Flows: []idem.AnyFlow{stays}})
	require.NoError(t, err)
	cfg.MonitorURL = "https://api.example.com/rides/requests"
	_, err = idemhttp.New(runner, stays, cfg)
	require.ErrorContains(t, err, "NoRedrive")
	cfg.InProgress = 7
	_, err = idemhttp.New(b.runner, b.flow, cfg)
	require.ErrorContains(t, err, "unknown InProgress")
}

// A panic out of a run (here the runner's Observer) whose client had left
// gives its place in Config.Detached back: a place kept for ever would,
// panic by panic, stop every later run whose client leaves.
func TestClientLeftRunPanicFreesItsPlace(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	detached := idemhttp.NewDetachedRuns(1)
	ctx, leave := context.WithCancel(context.Background())
	defer leave()
	runner := b.newRunner(t, &idem.Config{Observer: idem.ObserverFunc(func(_ context.Context, e idem.Event) {
		if e.Kind != idem.EventCreated {
			return
		}
		leave()
		require.Eventually(t, func() bool { return detached.Running() == 1 }, 30*time.Second, time.Millisecond,
			"the client left: the run is counted")
		panic("observer: nil map")
	})})
	h := b.handlerOn(t, runner, b.flow, func(c *idemhttp.Config[rideInput]) { c.Detached = detached })
	res := serve(h, request("k-1", rideBody).WithContext(ctx))
	require.Equal(t, http.StatusInternalServerError, res.Code, res.Body.String())
	require.Zero(t, detached.Running(), "the panicked run left the bound")
}

// A request that prefers respond-async and takes over a key an earlier
// attempt left part done is answered 202 at that key's recovery point,
// not "started": the last committed phase, as the monitor shows it.
func TestRespondAsyncTakeoverShowsItsRecoveryPoint(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	h, detached := b.asyncHandler(t, 10, func(c *idemhttp.Config[rideInput]) { c.ShowRecoveryPoint = true })
	b.failOnce("charge_created", func() error { return errors.New("provider timed out") })
	require.Equal(t, http.StatusInternalServerError, post(h, "k-1", rideBody).Code)
	require.Equal(t, "ride_created", b.keyRow(t, "k-1").RecoveryPoint)

	entered, release := b.blockPhase(t, "charge_created")
	res := postAsync(h, "k-1")
	require.Equal(t, http.StatusAccepted, res.Code, res.Body.String())
	<-entered
	require.Equal(t, "ride_created", decodeStatus(t, res).RecoveryPoint)
	release()
	require.Eventually(t, func() bool { return detached.Running() == 0 }, 30*time.Second, 10*time.Millisecond)
}

// DetachedRuns.Wait, after the server's Shutdown, waits for the runs
// answered 202 (which no handler holds for Shutdown to wait for), so that a
// deploy finishes them instead of leaving them half done to the completer.
func TestDetachedRunsWait(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	h, detached := b.asyncHandler(t, 10, nil)
	require.NoError(t, detached.Wait(context.Background()), "nothing runs")
	entered, release := b.blockPhase(t, "charge_created")
	res := postAsync(h, "k-1")
	require.Equal(t, http.StatusAccepted, res.Code, res.Body.String())
	<-entered

	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	err := detached.Wait(stopped)
	require.ErrorIs(t, err, context.Canceled, "the run is not over")
	require.ErrorContains(t, err, "1 detached run")

	release()
	require.NoError(t, detached.Wait(context.Background()))
	require.Zero(t, detached.Running())
	require.Equal(t, idemtype.StoredFinished, b.keyRow(t, "k-1").Status, "Wait returned once the run had ended")
}

// A retry that prefers respond-async of a key that runs gets its 202 even
// when Config.Detached is full (Config.InProgress: "either way"): it has
// nothing to run, so it must not fall back to the 409 of a request that
// preferred nothing.
func TestRespondAsyncRetryWhileBoundFull(t *testing.T) {
	t.Parallel()
	b := setup(t, idemhttp.ProfileIETF)
	h, detached := b.asyncHandler(t, 1, nil)
	entered, release := b.blockPhase(t, "charge_created")
	first := postAsync(h, "k-1")
	require.Equal(t, http.StatusAccepted, first.Code, first.Body.String())
	<-entered
	require.Equal(t, 1, detached.Running(), "the bound is full")

	again := postAsync(h, "k-1")
	require.Equal(t, http.StatusAccepted, again.Code, "the same 202, not 409: %s", again.Body)
	require.Equal(t, first.Header().Get("Location"), again.Header().Get("Location"))
	require.Equal(t, "respond-async", again.Header().Get("Preference-Applied"))
	require.Empty(t, again.Header().Get(idemhttp.AsyncHeader), "answered asynchronously: not declined")
	release()
	require.Eventually(t, func() bool { return detached.Running() == 0 }, 30*time.Second, 10*time.Millisecond)
}
