package ridesapp_test

import (
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/examples/rides/fakepay"
	"github.com/go-idem/idem/examples/rides/internal/ridesapp"
	"github.com/go-idem/idem/idemhttp"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
)

// The tests below port rocket-rides-atomic's spec/api_spec.rb, one for one
// (named after the Ruby examples), then add what the Ruby suite never
// checked.

const problemBase = idemhttp.ProblemTypeBaseDefault

// requireOneRide checks the database and the ledger after a request that
// answered 201: one ride, charged with the charge the answer names, one
// audit record, one receipt job and one charge at the provider, carrying the
// key's downstream idempotency key.
func requireOneRide(t *testing.T, b *testBundle, key string, ride ridesapp.RideResponse) {
	t.Helper()
	require.Equal(t, ridesapp.MessageRideCreated, ride.Message)
	require.Equal(t, ridesapp.RideAmount, ride.Amount)
	require.Equal(t, ridesapp.RideCurrency, ride.Currency)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM rides`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM rides WHERE id = $1 AND charge_id = $2 AND payment_status = 'charged'`,
		ride.RideID, ride.ChargeID))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM audit_records WHERE resource_type = 'ride' AND resource_id = $1 AND action = 'ride.created'`, ride.RideID))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM river_job WHERE kind = 'ride_receipt' AND (args->>'ride_id')::bigint = $1`, ride.RideID))

	charges := b.provider.Charges()
	require.Len(t, charges, 1)
	require.Equal(t, ride.ChargeID, charges[0].ID)
	require.Equal(t, ridesapp.RideAmount, charges[0].Amount)
	rec := b.key(t, b.goodUserID, key)
	require.Equal(t, rec.DownstreamKey(ridesapp.PhaseChargeCreated), charges[0].IdempotencyKey)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM rides WHERE id = $1 AND charge_reference = $2`,
		ride.RideID, rec.DownstreamKey(ridesapp.PhaseChargeCreated)))
	require.Equal(t, ridesapp.ChargeDescription(rec.DownstreamKey(ridesapp.PhaseChargeCreated)), charges[0].Description)
	require.Equal(t, idemtype.StoredFinished, rec.Status)
	require.Nil(t, rec.LockedAt)
}

// "passes for a new key"
func TestPassesForANewKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	key := newKey()
	resp := b.ride(t, key)
	ride := resp.ride(t)
	requireOneRide(t, b, key, ride)
	require.Empty(t, resp.header.Get("Idempotent-Replayed"))

	// The audit record has the client's address (from the request's
	// context, not its input) and the coordinates it sent.
	var ip, data string
	var userID int64
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT host(origin_ip), data::text, user_id FROM audit_records WHERE resource_id = $1`, ride.RideID).Scan(&ip, &data, &userID))
	require.Equal(t, "127.0.0.1", ip)
	require.Equal(t, b.goodUserID, userID)
	require.JSONEq(t, validBody, data)

	// The stored input carries the authenticated user, not the address.
	rec := b.key(t, b.goodUserID, key)
	require.JSONEq(t, `{"user_id": `+itoa(b.goodUserID)+`, "origin_lat": 37.7749, "origin_lon": -122.4194, "target_lat": 37.8044, "target_lon": -122.2712}`, string(rec.Params))
}

// "returns a stored result", and (not in the Ruby suite) the replay is the
// first answer byte for byte and does nothing again.
func TestReturnsAStoredResult(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	key := newKey()
	first := b.ride(t, key)
	ride := first.ride(t)

	again := b.ride(t, key)
	require.Equal(t, first.status, again.status)
	require.Equal(t, first.body, again.body)
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	require.Equal(t, "application/json", again.header.Get("Content-Type"))
	requireOneRide(t, b, key, ride)
	require.EqualValues(t, 1, b.payments.calls.Load(), "a replay never calls the provider")
}

// "passes for keys that are unlocked": the first attempt failed in its
// first phase, so the key was released at started; the retry runs it all.
func TestPassesForKeysThatAreUnlocked(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	key := newKey()
	b.setHook(func(_ context.Context, at idemtest.HookPoint) error {
		if at.Phase == ridesapp.PhaseRideCreated && at.Where == idemtest.HookBeforeCommit {
			return errInternal
		}
		return nil
	})
	require.Equal(t, http.StatusInternalServerError, b.ride(t, key).status)
	rec := b.key(t, b.goodUserID, key)
	require.Nil(t, rec.LockedAt)
	require.Equal(t, idemtype.RecoveryPointStarted, rec.RecoveryPoint)
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM rides`), "the failed phase rolled back")

	b.setHook(nil)
	resp := b.ride(t, key)
	requireOneRide(t, b, key, resp.ride(t))
}

// "passes for keys with a stale locked_at": the first attempt's process
// died holding the key. Until its lease runs out the key is in progress;
// after, the next attempt takes it over.
func TestPassesForKeysWithAStaleLock(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	key := newKey()
	b.crashAt(ridesapp.PhaseRideCreated, idemtest.HookBeforeCommit)
	_, err := b.post(t, "Bearer "+ridesapp.GoodUserEmail, key, validBody)
	require.Error(t, err, "a dead server sends no answer")
	rec := b.key(t, b.goodUserID, key)
	require.NotNil(t, rec.LockedAt)

	require.Equal(t, http.StatusConflict, b.ride(t, key).status, "the lease is still live")

	b.clock.Advance(b.app.Runner().Config().Lease + time.Second)
	resp := b.ride(t, key)
	requireOneRide(t, b, key, resp.ride(t))
	require.Equal(t, 2, b.key(t, b.goodUserID, key).Attempts)
}

// "stores results for a permanent failure": a declined card is an answer,
// stored and replayed (the replay is not in the Ruby suite).
func TestStoresResultsForAPermanentFailure(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	key := newKey()
	resp := b.postOK(t, "Bearer "+ridesapp.BadSourceUserEmail, key, validBody)
	require.Equal(t, http.StatusPaymentRequired, resp.status, "body: %s", resp.body)
	p := resp.problem(t)
	require.Equal(t, ridesapp.ProblemCardDeclined, p["type"])
	require.Equal(t, "Error from payment processor: Your card was declined.", p["detail"])
	require.EqualValues(t, http.StatusPaymentRequired, p["status"])
	rideID := int64(p["ride_id"].(float64))

	rec := b.key(t, b.badUserID, key)
	require.Equal(t, idemtype.StoredFinished, rec.Status)
	require.Equal(t, http.StatusPaymentRequired, rec.ResponseStatus)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM rides WHERE id = $1 AND payment_status = 'declined' AND charge_id IS NULL`, rideID))
	require.Empty(t, b.provider.Charges())
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM river_job`), "no receipt for a declined ride")

	// The stored 402, replayed.
	again := b.postOK(t, "Bearer "+ridesapp.BadSourceUserEmail, key, validBody)
	require.Equal(t, http.StatusPaymentRequired, again.status)
	require.Equal(t, resp.body, again.body)
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	require.Equal(t, "application/problem+json", again.header.Get("Content-Type"))
	require.EqualValues(t, 1, b.payments.calls.Load())
}

// "continues from started", "continues from ride_created", "continues from
// charge_created": the first attempt died at the start of the phase after
// the recovery point (nothing of that phase committed); once its lease ran
// out, the retry resumes there and runs no committed phase again. The key
// is acquired separately: acquired with ride_created, as by default, a
// death in ride_created leaves no key at started to continue from.
func TestContinuesFromRecoveryPoint(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		recoveryPoint string
		crashIn       string
	}{
		{idemtype.RecoveryPointStarted, ridesapp.PhaseRideCreated},
		{ridesapp.PhaseRideCreated, ridesapp.PhaseChargeCreated},
		{ridesapp.PhaseChargeCreated, ridesapp.PhaseReceiptEnqueued},
	} {
		t.Run(tc.recoveryPoint, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			key := newKey()
			b.crashAt(tc.crashIn, idemtest.HookPhaseStart)
			_, err := b.post(t, "Bearer "+ridesapp.GoodUserEmail, key, validBody)
			require.Error(t, err)
			require.Equal(t, tc.recoveryPoint, b.key(t, b.goodUserID, key).RecoveryPoint)
			callsBefore := b.payments.calls.Load()

			var ran []string
			var mu sync.Mutex
			b.setHook(func(_ context.Context, at idemtest.HookPoint) error {
				if at.Where == idemtest.HookPhaseStart {
					mu.Lock()
					ran = append(ran, at.Phase)
					mu.Unlock()
				}
				return nil
			})
			b.clock.Advance(b.app.Runner().Config().Lease + time.Second)
			resp := b.ride(t, key)
			requireOneRide(t, b, key, resp.ride(t))

			phases := b.app.Flow().PhaseNames()
			for i, name := range phases {
				if name == tc.crashIn {
					require.Equal(t, phases[i:], ran, "only the phases after the recovery point run")
				}
			}
			if tc.recoveryPoint == ridesapp.PhaseChargeCreated {
				require.Equal(t, callsBefore, b.payments.calls.Load(), "a committed charge is never asked for again")
			}
		})
	}
}

// "denies requests that are missing authentication", "denies requests with
// invalid authentication"
func TestDeniesRequestsWithoutValidAuthentication(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for name, tc := range map[string]struct {
		auth   string
		detail string
	}{
		"missing":        {"", ridesapp.DetailAuthRequired},
		"not bearer":     {"Basic dXNlcjpwYXNz", ridesapp.DetailAuthRequired},
		"empty bearer":   {"Bearer ", ridesapp.DetailAuthRequired},
		"unknown user":   {"Bearer bad-user@example.com", ridesapp.DetailAuthInvalid},
		"bare email too": {ridesapp.GoodUserEmail, ridesapp.DetailAuthRequired},
	} {
		key := newKey()
		resp := b.postOK(t, tc.auth, key, validBody)
		require.Equal(t, http.StatusUnauthorized, resp.status, name)
		p := resp.problem(t)
		require.Equal(t, problemBase+idemhttp.ProblemUnauthenticated, p["type"], name)
		require.Equal(t, tc.detail, p["detail"], name)
		require.Equal(t, `Bearer realm="rides"`, resp.header.Get("WWW-Authenticate"), name)
	}
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM idem_keys`), "nothing is recorded for an unauthenticated request")
}

// "denies requests that are missing a key", "denies requests that have a
// key that's too short"
func TestDeniesRequestsWithoutAValidKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)

	resp := b.postOK(t, "Bearer "+ridesapp.GoodUserEmail, "", validBody)
	require.Equal(t, http.StatusBadRequest, resp.status)
	require.Equal(t, problemBase+idemhttp.ProblemKeyMissing, resp.problem(t)["type"])

	resp = b.postOK(t, "Bearer "+ridesapp.GoodUserEmail, "xxx", validBody)
	require.Equal(t, http.StatusBadRequest, resp.status)
	p := resp.problem(t)
	require.Equal(t, problemBase+idemhttp.ProblemKeyMalformed, p["type"])
	require.Contains(t, p["detail"], "at least 20")

	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM idem_keys`))
}

// "denies requests that are missing parameters", and every other way the
// body can be wrong: 422 naming the field, before any key is written.
func TestDeniesRequestsWithInvalidParameters(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for name, tc := range map[string]struct {
		body   string
		fields []string
	}{
		"missing parameters":   {`{}`, []string{"origin_lat", "origin_lon", "target_lat", "target_lon"}},
		"one missing":          {`{"origin_lat": 1, "origin_lon": 2, "target_lat": 3}`, []string{"target_lon"}},
		"null":                 {`{"origin_lat": null, "origin_lon": 2, "target_lat": 3, "target_lon": 4}`, []string{"origin_lat"}},
		"not a number":         {`{"origin_lat": "north", "origin_lon": 2, "target_lat": 3, "target_lon": 4}`, []string{"origin_lat"}},
		"latitude too high":    {`{"origin_lat": 1, "origin_lon": 2, "target_lat": 90.5, "target_lon": 4}`, []string{"target_lat"}},
		"latitude too low":     {`{"origin_lat": -91, "origin_lon": 2, "target_lat": 3, "target_lon": 4}`, []string{"origin_lat"}},
		"longitude too high":   {`{"origin_lat": 1, "origin_lon": 180.01, "target_lat": 3, "target_lon": 4}`, []string{"origin_lon"}},
		"longitude too low":    {`{"origin_lat": 1, "origin_lon": 2, "target_lat": 3, "target_lon": -181}`, []string{"target_lon"}},
		"unknown member":       {`{"origin_lat": 1, "origin_lon": 2, "target_lat": 3, "target_lon": 4, "tip": 5}`, []string{"tip"}},
		"two wrong at the end": {`{"origin_lat": 1, "origin_lon": 200, "target_lat": 3, "target_lon": -200}`, []string{"origin_lon", "target_lon"}},
	} {
		resp := b.postOK(t, "Bearer "+ridesapp.GoodUserEmail, newKey(), tc.body)
		require.Equal(t, http.StatusUnprocessableEntity, resp.status, "%s: %s", name, resp.body)
		p := resp.problem(t)
		require.Equal(t, problemBase+idemhttp.ProblemInvalidInput, p["type"], name)
		var fields []string
		for _, e := range p["errors"].([]any) {
			fields = append(fields, e.(map[string]any)["field"].(string))
		}
		require.Equal(t, tc.fields, fields, name)
	}
	// The limits themselves are valid.
	resp := b.postOK(t, "Bearer "+ridesapp.GoodUserEmail, newKey(), `{"origin_lat": -90, "origin_lon": 180, "target_lat": 90, "target_lon": -180}`)
	require.Equal(t, http.StatusCreated, resp.status, "body: %s", resp.body)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM idem_keys`), "only the valid request wrote a key")
}

// "denies requests where parameters don't match on an existing key". The
// Ruby service answered 409; idem answers 422 (the IETF draft's status for
// a reused key; 400 in the Stripe profile).
func TestDeniesRequestsWhereParametersDontMatchOnAnExistingKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	key := newKey()
	ride := b.ride(t, key).ride(t)

	resp := b.postOK(t, "Bearer "+ridesapp.GoodUserEmail, key,
		`{"origin_lat": 10.0, "origin_lon": -122.4194, "target_lat": 37.8044, "target_lon": -122.2712}`)
	require.Equal(t, http.StatusUnprocessableEntity, resp.status)
	require.Equal(t, problemBase+idemhttp.ProblemKeyReused, resp.problem(t)["type"])
	requireOneRide(t, b, key, ride)

	// The same body with members reordered and spaced differently is the
	// same request: a replay.
	again := b.postOK(t, "Bearer "+ridesapp.GoodUserEmail, key,
		`{"target_lon":-122.2712,"target_lat":37.8044,"origin_lon":-122.4194,"origin_lat":37.7749}`)
	require.Equal(t, http.StatusCreated, again.status)
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))

	// A key belongs to its user: the same key from another user is another
	// request.
	other := b.postOK(t, "Bearer "+ridesapp.BadSourceUserEmail, key, validBody)
	require.Equal(t, http.StatusPaymentRequired, other.status)
}

// "denies requests that have an equivalent in flight", with the 409's body
// (not checked by the Ruby suite): while the first attempt is inside its
// charge, the same request is told to come back later, and nothing is
// stored for it.
func TestDeniesRequestsThatHaveAnEquivalentInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	key := newKey()
	entered, proceed := make(chan struct{}), make(chan struct{})
	letGo := sync.OnceFunc(func() { close(proceed) })
	t.Cleanup(letGo)
	b.setHook(func(_ context.Context, at idemtest.HookPoint) error {
		if at.Phase == ridesapp.PhaseChargeCreated && at.Where == idemtest.HookPhaseStart {
			close(entered)
			<-proceed
		}
		return nil
	})
	first := make(chan *response, 1)
	go func() {
		resp, err := b.post(t, "Bearer "+ridesapp.GoodUserEmail, key, validBody)
		if err != nil {
			resp = &response{status: -1, body: []byte(err.Error())}
		}
		first <- resp
	}()
	<-entered

	resp := b.ride(t, key)
	require.Equal(t, http.StatusConflict, resp.status)
	retryAfter := resp.header.Get("Retry-After")
	require.NotEmpty(t, retryAfter)
	p := resp.problem(t)
	require.Equal(t, problemBase+idemhttp.ProblemInProgress, p["type"])
	require.EqualValues(t, http.StatusConflict, p["status"])
	require.Contains(t, p["detail"], "Retry-After")
	require.Equal(t, ridesapp.PhaseRideCreated, b.key(t, b.goodUserID, key).RecoveryPoint)

	letGo()
	firstResp := <-first
	ride := firstResp.ride(t)
	requireOneRide(t, b, key, ride)
	again := b.ride(t, key)
	require.Equal(t, firstResp.body, again.body)
}

// "unlocks a key and returns 429 on a serialization failure". The Ruby
// spec made the charge call raise Sequel::SerializationFailure; here the
// phase's transaction fails to serialize, as it would under concurrent
// writers. The runner retries the phase; when every retry fails too, the
// request fails with a retryable 500 (the Ruby service sent 429) and the
// key is unlocked at its recovery point. The retries re-ran the charge
// phase, each time with the same downstream key, so the provider charged
// once.
func TestUnlocksAKeyOnASerializationFailure(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	key := newKey()
	b.setHook(func(_ context.Context, at idemtest.HookPoint) error {
		if at.Phase == ridesapp.PhaseChargeCreated && at.Where == idemtest.HookBeforeCommit {
			return &pgconn.PgError{Code: "40001", Message: "could not serialize access due to concurrent update"}
		}
		return nil
	})
	resp := b.ride(t, key)
	require.Equal(t, http.StatusInternalServerError, resp.status, "body: %s", resp.body)
	require.Equal(t, problemBase+idemhttp.ProblemRequestFailed, resp.problem(t)["type"])
	maxRetries := b.app.Runner().Config().MaxPhaseRetries
	require.EqualValues(t, maxRetries+1, b.payments.calls.Load(), "the phase is tried once and retried MaxPhaseRetries times")
	require.Len(t, b.provider.Charges(), 1, "every try used the same downstream key")

	rec := b.key(t, b.goodUserID, key)
	require.Nil(t, rec.LockedAt)
	require.Equal(t, ridesapp.PhaseRideCreated, rec.RecoveryPoint)
	require.Contains(t, rec.LastError, "serializ")

	b.setHook(nil)
	requireOneRide(t, b, key, b.ride(t, key).ride(t))
}

// "unlocks a key and returns 500 on an internal error", with the 500's body
// (not checked by the Ruby suite).
func TestUnlocksAKeyOnAnInternalError(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	key := newKey()
	b.payments.failWith(errInternal)
	resp := b.ride(t, key)
	require.Equal(t, http.StatusInternalServerError, resp.status)
	p := resp.problem(t)
	require.Equal(t, problemBase+idemhttp.ProblemRequestFailed, p["type"])
	require.EqualValues(t, http.StatusInternalServerError, p["status"])
	require.Contains(t, p["detail"], "retry it with the same key")
	require.NotContains(t, string(resp.body), errInternal.Error(), "internal errors are logged, not sent")
	require.EqualValues(t, 1, b.payments.calls.Load(), "a plain error is not retried by the runner")

	rec := b.key(t, b.goodUserID, key)
	require.Nil(t, rec.LockedAt)
	require.Equal(t, ridesapp.PhaseRideCreated, rec.RecoveryPoint)
	require.Contains(t, rec.LastError, errInternal.Error())
	require.Contains(t, rec.LastError, ridesapp.ErrPaymentsUnavailable.Error())
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM rides WHERE payment_status = 'pending'`))

	b.payments.failWith(nil)
	requireOneRide(t, b, key, b.ride(t, key).ride(t))
}

// The Ruby service staged its receipt in a staged_jobs table and an
// enqueuer moved it to the queue. With River the job is inserted in the
// phase's own transaction: it exists exactly when the phase committed, so
// a phase that fails or dies takes its job with it.
func TestReceiptJobIsInsertedInThePhaseTransaction(t *testing.T) {
	t.Parallel()
	for name, fault := range map[string]error{
		"phase error": errInternal,
		"crash":       idemtest.ErrSimulatedCrash,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			key := newKey()
			var visibleOutside []int
			b.setHook(func(ctx context.Context, at idemtest.HookPoint) error {
				if at.Phase == ridesapp.PhaseReceiptEnqueued && at.Where == idemtest.HookBeforeCommit {
					// The job is written but not committed: nobody else sees it.
					visibleOutside = append(visibleOutside, b.count(t, `SELECT count(*) FROM river_job`))
					return fault
				}
				return nil
			})
			_, err := b.post(t, "Bearer "+ridesapp.GoodUserEmail, key, validBody)
			if fault == idemtest.ErrSimulatedCrash {
				require.Error(t, err)
				b.clock.Advance(b.app.Runner().Config().Lease + time.Second)
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, []int{0}, visibleOutside)
			require.Equal(t, 0, b.count(t, `SELECT count(*) FROM river_job`), "the job rolled back with its phase")
			require.Equal(t, ridesapp.PhaseChargeCreated, b.key(t, b.goodUserID, key).RecoveryPoint)

			b.setHook(nil)
			requireOneRide(t, b, key, b.ride(t, key).ride(t))
		})
	}
}

// Not in the Ruby suite: many identical requests at once. Exactly one runs
// the flow; the others are told it is in progress or get its replay; one
// ride, one charge, one receipt job.
func TestConcurrentIdenticalRequests(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	key := newKey()
	const senders = 16
	start := make(chan struct{})
	answers := make(chan *response, senders)
	var wg sync.WaitGroup
	for range senders {
		wg.Go(func() {
			<-start
			resp, err := b.post(t, "Bearer "+ridesapp.GoodUserEmail, key, validBody)
			if err != nil {
				resp = &response{status: -1, body: []byte(err.Error())}
			}
			answers <- resp
		})
	}
	close(start)
	wg.Wait()
	close(answers)

	executed, replayed, conflicts := 0, 0, 0
	var body []byte
	for resp := range answers {
		switch {
		case resp.status == http.StatusCreated && resp.header.Get("Idempotent-Replayed") == "":
			executed++
			body = resp.body
		case resp.status == http.StatusCreated:
			replayed++
		case resp.status == http.StatusConflict:
			conflicts++
		default:
			t.Fatalf("unexpected answer %d: %s", resp.status, resp.body)
		}
	}
	require.Equal(t, 1, executed)
	require.Equal(t, senders, executed+replayed+conflicts)
	final := b.ride(t, key)
	require.Equal(t, body, final.body)
	requireOneRide(t, b, key, final.ride(t))
	require.EqualValues(t, 1, b.payments.calls.Load())
}

// Not in the Ruby suite: the nasty case. The provider charges, then drops
// the connection without answering. The phase cannot know it charged, so
// it fails; the retry asks again with the same downstream key and the
// provider returns the original charge. One ride, one charge.
func TestProviderDropsTheConnectionAfterCharging(t *testing.T) {
	t.Parallel()
	b := setup(t, &options{fakepay: &fakepay.Config{DropRate: 1}})
	key := newKey()
	resp := b.ride(t, key)
	require.Equal(t, http.StatusInternalServerError, resp.status, "body: %s", resp.body)
	require.Len(t, b.provider.Charges(), 1, "the provider did charge")
	rec := b.key(t, b.goodUserID, key)
	require.Equal(t, ridesapp.PhaseRideCreated, rec.RecoveryPoint)
	require.Contains(t, rec.LastError, "no response")
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM rides WHERE charge_id IS NOT NULL`))

	ride := b.ride(t, key).ride(t)
	requireOneRide(t, b, key, ride)
	require.EqualValues(t, 2, b.payments.calls.Load())
}

// The provider refusing the request outright (not a decline, not a
// transient failure) is stored as a 502: retrying cannot change it.
func TestProviderRejectsTheChargeRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	key := newKey()
	b.payments.failWith(&fakepay.APIError{StatusCode: http.StatusBadRequest, Type: fakepay.ErrorTypeInvalidRequest, Message: "bad customer"})
	resp := b.ride(t, key)
	require.Equal(t, http.StatusBadGateway, resp.status)
	require.Equal(t, ridesapp.ProblemPaymentFailed, resp.problem(t)["type"])
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM rides WHERE payment_status = 'failed'`))

	b.payments.failWith(nil)
	again := b.ride(t, key)
	require.Equal(t, resp.body, again.body)
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
}

func TestHealthz(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	resp, err := b.api.Client().Get(b.api.URL + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

}

// Other methods on the API's paths are a 405 problem with Allow, like every
// other error of the API, not ServeMux's plain-text 405.
func TestMethodNotAllowedIsAProblem(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, tc := range []struct{ method, path, allow string }{
		{http.MethodGet, "/rides", "POST"},
		{http.MethodPut, "/rides", "POST"},
		{http.MethodPatch, "/rides", "POST"},
		{http.MethodDelete, "/rides", "POST"},
		{http.MethodPost, "/healthz", "GET, HEAD"},
	} {
		req, err := http.NewRequest(tc.method, b.api.URL+tc.path, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+ridesapp.GoodUserEmail)
		req.Header.Set("Idempotency-Key", newKey())
		resp, err := b.api.Client().Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		r := &response{status: resp.StatusCode, header: resp.Header, body: body}
		require.Equal(t, http.StatusMethodNotAllowed, r.status, "%s %s", tc.method, tc.path)
		require.Equal(t, tc.allow, r.header.Get("Allow"), "%s %s", tc.method, tc.path)
		p := r.problem(t)
		require.Equal(t, problemBase+idemhttp.ProblemMethodNotAllowed, p["type"])
		require.EqualValues(t, http.StatusMethodNotAllowed, p["status"])
	}
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM idem_keys`))
}

func TestChargeDescriptionRoundTrips(t *testing.T) {
	t.Parallel()
	ref, ok := ridesapp.ParseChargeDescription(ridesapp.ChargeDescription("idem-0123abcd"))
	require.True(t, ok)
	require.Equal(t, "idem-0123abcd", ref)
	for _, bad := range []string{"", "Charge for ride request ", "Charge for ride 42", "Charge for ride request idem-1 again", "charge for ride request idem-1"} {
		_, ok := ridesapp.ParseChargeDescription(bad)
		require.False(t, ok, bad)
	}
}
