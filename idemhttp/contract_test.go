package idemhttp_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemhttp"
	"github.com/go-idem/idem/idemtype"
)

// The titles are part of the contract (docs/http.md lists them).
var wantTitles = map[string]string{
	idemhttp.ProblemKeyMissing:           "Idempotency-Key is missing",
	idemhttp.ProblemKeyMalformed:         "Idempotency-Key is malformed",
	idemhttp.ProblemKeyReused:            "Idempotency-Key is already used",
	idemhttp.ProblemInProgress:           "A request is outstanding for this Idempotency-Key",
	idemhttp.ProblemNeedsReconcile:       "The outcome of this request is being reconciled",
	idemhttp.ProblemRequestAbandoned:     "The request was abandoned",
	idemhttp.ProblemStoreUnavailable:     "Idempotency key store unavailable",
	idemhttp.ProblemRequestFailed:        "Request failed before it completed",
	idemhttp.ProblemUnauthenticated:      "Authentication required",
	idemhttp.ProblemMethodNotAllowed:     "Method not allowed",
	idemhttp.ProblemUnsupportedMediaType: "Unsupported media type",
	idemhttp.ProblemBodyTooLarge:         "Request body too large",
	idemhttp.ProblemMalformedJSON:        "Request body is not valid JSON",
	idemhttp.ProblemInvalidInput:         "Request body is invalid",
	idemhttp.ProblemInternal:             "Internal server error",
}

// contractCase is one situation of the HTTP contract (DESIGN section 5,
// plus the rest of the rules), run in both profiles.
type contractCase struct {
	name string
	// serve sets the situation up and returns the response under test.
	serve func(t *testing.T, b *bundle) *httptest.ResponseRecorder
	// status is the IETF profile's status; stripeStatus the Stripe
	// profile's, when it differs.
	status, stripeStatus int
	// problem is the problem type name; empty for a flow's own response.
	problem string
	// stripeType is the "error.type" member of the Stripe profile.
	stripeType string
	stripeCode string
	// header lists headers the response must carry, exactly; "" means
	// the header must be absent.
	header map[string]string
	// check verifies the database and anything else particular to the case.
	check func(t *testing.T, b *bundle, res *httptest.ResponseRecorder)
}

func nothingWritten(t *testing.T, b *bundle, _ *httptest.ResponseRecorder) {
	b.requireNothingWritten(t)
}

// badKey is a case for a malformed Idempotency-Key.
func badKey(name string, values ...string) contractCase {
	return contractCase{
		name: name,
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			r := request("", rideBody)
			r.Header["Idempotency-Key"] = values
			return serve(b.handler(t, nil), r)
		},
		status: http.StatusBadRequest, problem: idemhttp.ProblemKeyMalformed, stripeType: idemhttp.StripeInvalidRequestError,
		check: nothingWritten,
	}
}

// passThrough is a case for a method that the middleware hands to the next
// handler without looking for a key.
func passThrough(method string) contractCase {
	return contractCase{
		name: method + " passes through the middleware without a key",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Next", r.Method)
				w.WriteHeader(http.StatusOK)
			})
			r := httptest.NewRequest(method, "/rides", nil) // no key, no body, no auth
			return serve(b.handler(t, nil).Middleware(next), r)
		},
		status: http.StatusOK, header: map[string]string{"X-Next": method, "Content-Type": ""},
		check: nothingWritten,
	}
}

// notAllowed is a case for a method sent to the Handler alone.
func notAllowed(method string) contractCase {
	return contractCase{
		name: method + " on the handler alone is 405",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			r := httptest.NewRequest(method, "/rides", nil)
			r.Header.Set("Authorization", testAuth)
			return serve(b.handler(t, nil), r)
		},
		status: http.StatusMethodNotAllowed, problem: idemhttp.ProblemMethodNotAllowed, stripeType: idemhttp.StripeInvalidRequestError,
		header: map[string]string{"Allow": "POST, PATCH"},
		check:  nothingWritten,
	}
}

// phaseFails is a case for a phase that fails once with fail.
func phaseFails(name string, fail func() error) contractCase {
	return contractCase{
		name: name,
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			b.failOnce("charge_created", fail)
			return post(b.handler(t, nil), "k-1", rideBody)
		},
		status: http.StatusInternalServerError, problem: idemhttp.ProblemRequestFailed, stripeType: idemhttp.StripeAPIError,
		stripeCode: idemhttp.CodeRequestUnfinished,
		check: func(t *testing.T, b *bundle, _ *httptest.ResponseRecorder) {
			row := b.keyRow(t, "k-1")
			require.Equal(t, idemtype.StoredRunning, row.Status)
			require.Equal(t, "ride_created", row.RecoveryPoint, "the committed phase stays committed")
			require.Nil(t, row.LockedAt, "the lock is released")
			require.Zero(t, row.ResponseStatus, "nothing is stored")
			require.Empty(t, row.ResponseBody)
			require.NotEmpty(t, row.LastError)

			retry := post(b.handler(t, nil), "k-1", rideBody)
			require.Equal(t, http.StatusCreated, retry.Code, retry.Body.String())
			require.Empty(t, retry.Header().Get("Idempotent-Replayed"))
			require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 2, "responded": 1}, b.counts.Get(),
				"the retry resumes after the committed phase")
			require.Equal(t, 1, b.countRows(t, "rides"))
		},
	}
}

var contractCases = []contractCase{
	// POST/PATCH without key on an endpoint that requires one: 400.
	{
		name:   "POST without a key",
		serve:  func(t *testing.T, b *bundle) *httptest.ResponseRecorder { return post(b.handler(t, nil), "", rideBody) },
		status: http.StatusBadRequest, problem: idemhttp.ProblemKeyMissing, stripeType: idemhttp.StripeInvalidRequestError,
		check: nothingWritten,
	},
	{
		name: "PATCH without a key",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			r := request("", rideBody)
			r.Method = http.MethodPatch
			return serve(b.handler(t, nil), r)
		},
		status: http.StatusBadRequest, problem: idemhttp.ProblemKeyMissing, stripeType: idemhttp.StripeInvalidRequestError,
		check: nothingWritten,
	},
	{
		name: "POST with only an empty key header",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			return post(b.handler(t, nil), " ", rideBody)
		},
		status: http.StatusBadRequest, problem: idemhttp.ProblemKeyMissing, stripeType: idemhttp.StripeInvalidRequestError,
		check: nothingWritten,
	},

	{
		name: "an empty key field beside a key is ignored",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			r := request("", rideBody)
			r.Header["Idempotency-Key"] = []string{"", "k-1", " "}
			return serve(b.handler(t, nil), r)
		},
		status: http.StatusCreated,
		check:  func(t *testing.T, b *bundle, res *httptest.ResponseRecorder) { b.requireFinished(t, "k-1", res) },
	},

	// Key empty, > 255 chars, non-printable, bad sf-string: 400. An empty
	// field is no key (missing, above); "" is a key, and an empty one.
	badKey("empty sf-string key", `""`),
	badKey("an empty field and an empty sf-string", "", `""`),
	badKey("key of 256 characters", strings.Repeat("k", 256)),
	badKey("key with a control character", "abc\x01def"),
	badKey("key with a non-ASCII character", "caf\u00e9"),
	badKey("unterminated sf-string", `"abc`),
	badKey("sf-string with a bad escape", `"a\nb"`),
	badKey("two keys", "abc", "def"),
	badKey("a list of keys", `"abc", "def"`),
	// A comma outside a quoted key is a list, or two field lines a proxy
	// merged (RFC 9110 section 5.3): never one key.
	badKey("a bare key, then a quoted one", `first-key-aaaa, "second-key-bbbb"`),
	badKey("a list of bare keys", "k1, k2"),
	badKey("a bare key with a comma", "k1,k2"),
	badKey("a quoted key, then a bare one", `"k1", k2`),
	{
		name: "key shorter than MinKeyLength",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			h := b.handler(t, func(c *idemhttp.Config[rideInput]) { c.MinKeyLength = 16 })
			return post(h, "short-key", rideBody)
		},
		status: http.StatusBadRequest, problem: idemhttp.ProblemKeyMalformed, stripeType: idemhttp.StripeInvalidRequestError,
		check: nothingWritten,
	},

	// Key accepted in both forms: "quoted" sf-string and bare token.
	{
		name: "quoted key, then the same key bare, replays",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			h := b.handler(t, nil)
			first := post(h, `"ride-1";v=2`, rideBody)
			require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
			require.Empty(t, first.Header().Get("Idempotent-Replayed"))
			return post(h, "ride-1", rideBody)
		},
		status: http.StatusCreated, header: map[string]string{"Idempotent-Replayed": "true", "Content-Type": "application/json"},
		check: func(t *testing.T, b *bundle, res *httptest.ResponseRecorder) {
			b.requireFinished(t, "ride-1", res)
			require.Equal(t, 1, b.countRows(t, "idem_keys"))
		},
	},
	{
		name: "bare key, then the same key quoted, replays",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			h := b.handler(t, nil)
			first := post(h, `ride "1"`, rideBody)
			require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
			return post(h, idemhttp.FormatKey(`ride "1"`), rideBody)
		},
		status: http.StatusCreated, header: map[string]string{"Idempotent-Replayed": "true"},
		check: func(t *testing.T, b *bundle, res *httptest.ResponseRecorder) { b.requireFinished(t, `ride "1"`, res) },
	},

	// Same key + same payload, finished: stored status + body + allowed
	// headers, Idempotent-Replayed: true.
	{
		name: "same key and payload replays byte for byte",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			h := b.handler(t, nil)
			first := post(h, "k-1", rideBody)
			require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
			// The same value, spelt differently: key order, whitespace and
			// escapes do not change the fingerprint.
			replay := post(h, "k-1", "{ \"amount\": 20,\n\"origin\": \"\\u0053FO\" }")
			require.Equal(t, first.Code, replay.Code)
			require.Equal(t, first.Body.Bytes(), replay.Body.Bytes())
			firstHeader := first.Header().Clone()
			replayHeader := replay.Header().Clone()
			replayHeader.Del("Idempotent-Replayed")
			require.Equal(t, firstHeader, replayHeader, "the first response and the replay carry the same headers")
			return replay
		},
		status: http.StatusCreated,
		header: map[string]string{
			"Idempotent-Replayed": "true", "Content-Type": "application/json", "Location": "/rides/1",
			"Set-Cookie": "", "Authorization": "", "Connection": "", "X-Ride": "", "Cache-Control": "",
		},
		check: func(t *testing.T, b *bundle, res *httptest.ResponseRecorder) {
			b.requireFinished(t, "k-1", res)
			require.JSONEq(t, `{"ride_id": 1, "charge_id": "ch_1"}`, res.Body.String())
			row := b.keyRow(t, "k-1")
			require.Equal(t, "POST", row.Method)
			require.Equal(t, "/rides", row.Path)
			require.JSONEq(t, `{"user_id": "alice", "origin": "SFO", "amount": 20}`, string(row.Params),
				"the prepared input is what is stored and fingerprinted")
		},
	},

	// Same key + different payload or endpoint: 422 / Stripe 400
	// idempotency_error.
	{
		name: "same key, different payload",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			h := b.handler(t, nil)
			require.Equal(t, http.StatusCreated, post(h, "k-1", rideBody).Code)
			return post(h, "k-1", `{"origin": "SFO", "amount": 21}`)
		},
		status: http.StatusUnprocessableEntity, stripeStatus: http.StatusBadRequest,
		problem: idemhttp.ProblemKeyReused, stripeType: idemhttp.StripeIdempotencyError,
		header: map[string]string{"Idempotent-Replayed": ""},
		check: func(t *testing.T, b *bundle, _ *httptest.ResponseRecorder) {
			row := b.keyRow(t, "k-1")
			require.Equal(t, idemtype.StoredFinished, row.Status)
			require.Equal(t, http.StatusCreated, row.ResponseStatus, "the stored response is untouched")
			require.Equal(t, 1, b.countRows(t, "rides"))
		},
	},
	{
		name: "same key, different endpoint",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			require.Equal(t, http.StatusCreated, post(b.handler(t, nil), "k-1", rideBody).Code)
			return post(b.handlerOn(t, b.runner, b.quote, nil), "k-1", rideBody)
		},
		status: http.StatusUnprocessableEntity, stripeStatus: http.StatusBadRequest,
		problem: idemhttp.ProblemKeyReused, stripeType: idemhttp.StripeIdempotencyError,
		check: func(t *testing.T, b *bundle, _ *httptest.ResponseRecorder) {
			require.Equal(t, "rides.create", b.keyRow(t, "k-1").Flow)
			require.Zero(t, b.counts.Get()["quoted"])
		},
	},

	// A key is bound to the method and route of its first request, not only
	// to the flow: the same flow mounted twice is two endpoints.
	{
		name: "same key and flow, another route",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			h := b.handler(t, nil)
			mux := http.NewServeMux()
			mux.Handle("POST /stripe", h)
			mux.Handle("PATCH /ietf", h)
			first := serve(mux, requestTo(http.MethodPost, "/stripe", "k-1", rideBody))
			require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
			return serve(mux, requestTo(http.MethodPatch, "/ietf", "k-1", rideBody))
		},
		status: http.StatusUnprocessableEntity, stripeStatus: http.StatusBadRequest,
		problem: idemhttp.ProblemKeyReused, stripeType: idemhttp.StripeIdempotencyError,
		header: map[string]string{"Idempotent-Replayed": ""},
		check: func(t *testing.T, b *bundle, _ *httptest.ResponseRecorder) {
			row := b.keyRow(t, "k-1")
			require.Equal(t, "POST", row.Method)
			require.Equal(t, "/stripe", row.Path, "the route is the mux pattern, without its method")
			require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 1, "responded": 1}, b.counts.Get())
		},
	},
	{
		name: "same key and route, another method",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			mux := http.NewServeMux()
			mux.Handle("/rides", b.handler(t, nil).Middleware(http.NotFoundHandler()))
			first := serve(mux, requestTo(http.MethodPost, "/rides", "k-1", rideBody))
			require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
			return serve(mux, requestTo(http.MethodPatch, "/rides", "k-1", rideBody))
		},
		status: http.StatusUnprocessableEntity, stripeStatus: http.StatusBadRequest,
		problem: idemhttp.ProblemKeyReused, stripeType: idemhttp.StripeIdempotencyError,
		check: func(t *testing.T, b *bundle, _ *httptest.ResponseRecorder) {
			row := b.keyRow(t, "k-1")
			require.Equal(t, "POST", row.Method)
			require.Equal(t, idemtype.StoredFinished, row.Status)
			require.Equal(t, 1, b.countRows(t, "rides"))
		},
	},
	{
		name: "an unfinished key is not taken over from another route",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			h := b.handler(t, nil)
			mux := http.NewServeMux()
			mux.Handle("POST /stripe", h)
			mux.Handle("POST /ietf", h)
			b.failOnce("charge_created", func() error { return errors.New("provider timed out") })
			first := serve(mux, requestTo(http.MethodPost, "/stripe", "k-1", rideBody))
			require.Equal(t, http.StatusInternalServerError, first.Code, first.Body.String())
			return serve(mux, requestTo(http.MethodPost, "/ietf", "k-1", rideBody))
		},
		status: http.StatusUnprocessableEntity, stripeStatus: http.StatusBadRequest,
		problem: idemhttp.ProblemKeyReused, stripeType: idemhttp.StripeIdempotencyError,
		check: func(t *testing.T, b *bundle, _ *httptest.ResponseRecorder) {
			row := b.keyRow(t, "k-1")
			require.Equal(t, idemtype.StoredRunning, row.Status)
			require.Equal(t, "ride_created", row.RecoveryPoint)
			require.Equal(t, int64(1), row.Fence, "nobody took the key over")
			require.Equal(t, 1, row.Attempts)
			require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 1}, b.counts.Get())

			h := b.handler(t, nil)
			mux := http.NewServeMux()
			mux.Handle("POST /stripe", h)
			retry := serve(mux, requestTo(http.MethodPost, "/stripe", "k-1", rideBody))
			require.Equal(t, http.StatusCreated, retry.Code, retry.Body.String())
			require.Equal(t, 1, b.countRows(t, "rides"))
		},
	},

	// Same key, first still running: 409 + Retry-After, not stored.
	{
		name: "same key while the first is running",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			h := b.handler(t, nil)
			entered, release := b.blockPhase(t, "charge_created")
			first := make(chan *httptest.ResponseRecorder, 1)
			go func() { first <- post(h, "k-1", rideBody) }()
			<-entered
			second := post(h, "k-1", rideBody)

			row := b.keyRow(t, "k-1")
			require.Equal(t, idemtype.StoredRunning, row.Status)
			require.NotNil(t, row.LockedAt)
			require.Zero(t, row.ResponseStatus, "nothing about the 409 is stored")

			release()
			require.Equal(t, http.StatusCreated, (<-first).Code)
			return second
		},
		status: http.StatusConflict, problem: idemhttp.ProblemInProgress,
		stripeType: idemhttp.StripeIdempotencyError, stripeCode: "idempotency_key_in_use",
		// The clock stands still: the whole 90 s lease is left.
		header: map[string]string{"Retry-After": "2"}, // the lease's 90 s, capped by Config.MaxRetryAfter
		check: func(t *testing.T, b *bundle, _ *httptest.ResponseRecorder) {
			require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 1, "responded": 1}, b.counts.Get())
			replay := post(b.handler(t, nil), "k-1", rideBody)
			require.Equal(t, http.StatusCreated, replay.Code)
			require.Equal(t, "true", replay.Header().Get("Idempotent-Replayed"))
		},
	},
	{
		name: "lock lost to a takeover is answered as in progress",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			// The stale worker holds the key, leased, in its first phase.
			h := b.handler(t, nil)
			entered, release := b.blockPhase(t, "ride_created")
			stale := make(chan *httptest.ResponseRecorder, 1)
			go func() { stale <- post(h, "k-1", rideBody) }()
			<-entered
			// The first worker looks dead: its lease expires and a retry
			// takes the key over and finishes it.
			b.clock.Advance(91 * time.Second)
			retry := post(h, "k-1", rideBody)
			require.Equal(t, http.StatusCreated, retry.Code, retry.Body.String())
			release()
			return <-stale
		},
		status: http.StatusConflict, problem: idemhttp.ProblemInProgress,
		stripeType: idemhttp.StripeIdempotencyError, stripeCode: "idempotency_key_in_use",
		header: map[string]string{"Retry-After": "1"},
		check: func(t *testing.T, b *bundle, _ *httptest.ResponseRecorder) {
			row := b.keyRow(t, "k-1")
			require.Equal(t, idemtype.StoredFinished, row.Status)
			require.Equal(t, int64(2), row.Fence)
			require.Equal(t, 1, b.countRows(t, "rides"), "the stale worker's phase rolled back")
		},
	},
	{
		name: "key waiting for reconciliation",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			h, err := idemhttp.New(b.runner, b.sms, &idemhttp.Config[smsInput]{Scope: bearerScope, Profile: b.profile})
			require.NoError(t, err)
			first := post(h, "k-1", `{"to": "+15550100"}`)
			require.Equal(t, http.StatusServiceUnavailable, first.Code, first.Body.String())
			return post(h, "k-1", `{"to": "+15550100"}`)
		},
		status: http.StatusServiceUnavailable, problem: idemhttp.ProblemNeedsReconcile, stripeType: idemhttp.StripeAPIError,
		header: map[string]string{"Retry-After": "60"},
		check: func(t *testing.T, b *bundle, _ *httptest.ResponseRecorder) {
			row := b.keyRow(t, "k-1")
			require.Equal(t, idemtype.StoredNeedsReconcile, row.Status)
			require.Equal(t, 1, b.counts.Get()["sms_sent"], "a call of unknown outcome is never re-run blindly")
		},
	},
	{
		name: "key an operator abandoned",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			h, err := idemhttp.New(b.runner, b.sms, &idemhttp.Config[smsInput]{Scope: bearerScope, Profile: b.profile})
			require.NoError(t, err)
			first := post(h, "k-1", `{"to": "+15550100"}`)
			require.Equal(t, http.StatusServiceUnavailable, first.Code, first.Body.String())
			row := b.keyRow(t, "k-1")
			_, err = b.runner.Resolve(context.Background(), row.Scope, "k-1",
				idem.Resolution{Verdict: idem.ResolveAbandon, Operator: "alice", Reason: "INC-42: refunded by hand"})
			require.NoError(t, err)
			return post(h, "k-1", `{"to": "+15550100"}`)
		},
		status: http.StatusGone, problem: idemhttp.ProblemRequestAbandoned, stripeType: idemhttp.StripeIdempotencyError,
		check: func(t *testing.T, b *bundle, _ *httptest.ResponseRecorder) {
			row := b.keyRow(t, "k-1")
			require.Equal(t, idemtype.StoredFinished, row.Status)
			require.Equal(t, idemtype.RecoveryPointAbandoned, row.RecoveryPoint)
			require.Equal(t, 1, b.counts.Get()["sms_sent"], "nothing runs again")
		},
	},

	// Key store unreachable: 503, fail closed, nothing executed.
	{
		name: "key store unreachable",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			return post(b.handlerOn(t, b.unreachableRunner(t), b.flow, nil), "k-1", rideBody)
		},
		status: http.StatusServiceUnavailable, problem: idemhttp.ProblemStoreUnavailable, stripeType: idemhttp.StripeAPIError,
		header: map[string]string{"Retry-After": "5"},
		check: func(t *testing.T, b *bundle, _ *httptest.ResponseRecorder) {
			require.Empty(t, b.counts.Get(), "no phase may run when the store is unreachable")
			require.Zero(t, b.provider.Charges())
		},
	},

	// Phase returned a Go error / panicked: 500, not stored, lock released,
	// retry resumes.
	phaseFails("phase returns an error, then the retry resumes", func() error { return errors.New("provider timed out") }),
	phaseFails("phase panics, then the retry resumes", func() error { panic("nil map in the charge phase") }),

	// A response with a status outside 200-599 is the phase's error, not
	// the request's stored outcome.
	{
		name: "a phase responding with status 100 fails and stores nothing",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			flow := idem.MustNewFlow("rides.odd", []idem.Phase[rideInput]{{
				Name: "responded",
				Do: func(context.Context, idem.Tx, *idem.Attempt[rideInput]) (idem.Result, error) {
					b.counts.Add("responded")
					return idem.Respond(http.StatusContinue, nil, nil), nil
				},
			}}, nil)
			h := b.handlerOn(t, b.runnerWith(t, flow), flow, nil)
			first := post(h, "k-1", rideBody)
			require.Equal(t, http.StatusInternalServerError, first.Code, first.Body.String())
			return post(h, "k-1", rideBody)
		},
		status: http.StatusInternalServerError, problem: idemhttp.ProblemRequestFailed, stripeType: idemhttp.StripeAPIError,
		stripeCode: idemhttp.CodeRequestUnfinished,
		check: func(t *testing.T, b *bundle, _ *httptest.ResponseRecorder) {
			row := b.keyRow(t, "k-1")
			require.Equal(t, idemtype.StoredRunning, row.Status, "the key did not finish")
			require.Equal(t, idemtype.RecoveryPointStarted, row.RecoveryPoint)
			require.Zero(t, row.ResponseStatus, "nothing is stored")
			require.Nil(t, row.LockedAt)
			require.Contains(t, row.LastError, "100")
			require.Equal(t, map[string]int{"responded": 2}, b.counts.Get(), "the retry ran the phase again")
		},
	},

	// What a 500 leaves behind: the key, bound to its payload, with the
	// phases that committed. A corrected body needs a new key.
	{
		name: "after a 500 the key stays bound to its payload",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			b.failOnce("charge_created", func() error { return errors.New("provider timed out") })
			h := b.handler(t, nil)
			first := post(h, "k-1", rideBody)
			require.Equal(t, http.StatusInternalServerError, first.Code, first.Body.String())
			p := decodeProblem(t, first)
			require.Equal(t, idemhttp.ProblemTypeBaseDefault+idemhttp.ProblemRequestFailed, p.Type)
			require.NotContains(t, p.Detail, "Nothing was stored", "the key and the committed phases are kept")
			require.Contains(t, p.Detail, "the same key and the same body")
			return post(h, "k-1", `{"origin": "SFO", "amount": 21}`)
		},
		status: http.StatusUnprocessableEntity, stripeStatus: http.StatusBadRequest,
		problem: idemhttp.ProblemKeyReused, stripeType: idemhttp.StripeIdempotencyError,
		check: func(t *testing.T, b *bundle, _ *httptest.ResponseRecorder) {
			row := b.keyRow(t, "k-1")
			require.Equal(t, idemtype.StoredRunning, row.Status)
			require.Equal(t, "ride_created", row.RecoveryPoint, "the committed phase is kept")
			require.Nil(t, row.LockedAt, "the key is released")
			require.Zero(t, row.ResponseStatus, "no response is stored")
			require.Contains(t, row.LastError, "provider timed out", "the error is recorded for operators")
			require.JSONEq(t, `{"user_id": "alice", "origin": "SFO", "amount": 20}`, string(row.Params))
			require.Equal(t, 1, b.countRows(t, "rides"), "the committed phase's writes are kept")
			require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 1}, b.counts.Get())

			retry := post(b.handler(t, nil), "k-1", rideBody)
			require.Equal(t, http.StatusCreated, retry.Code, retry.Body.String())
			require.Equal(t, 1, b.countRows(t, "rides"))
		},
	},

	// GET, HEAD, PUT, DELETE, OPTIONS: pass through, no key needed.
	passThrough(http.MethodGet),
	passThrough(http.MethodHead),
	passThrough(http.MethodPut),
	passThrough(http.MethodDelete),
	passThrough(http.MethodOptions),
	notAllowed(http.MethodGet),
	notAllowed(http.MethodHead),
	notAllowed(http.MethodPut),
	notAllowed(http.MethodDelete),
	notAllowed(http.MethodOptions),
	{
		name: "other methods of a POST-only route are 405 through MethodNotAllowed",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			h := b.handler(t, nil)
			mux := http.NewServeMux()
			mux.Handle("POST /rides", h)
			mux.Handle("/rides", h.MethodNotAllowed(http.MethodPost))
			for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
				res := serve(mux, requestTo(method, "/rides", "k-1", rideBody))
				require.Equal(t, http.StatusMethodNotAllowed, res.Code, method)
				require.Equal(t, "application/problem+json", res.Header().Get("Content-Type"), method)
				require.Equal(t, "POST", res.Header().Get("Allow"), method)
			}
			require.Equal(t, http.StatusCreated, serve(mux, requestTo(http.MethodPost, "/rides", "k-2", rideBody)).Code)
			return serve(mux, requestTo(http.MethodPatch, "/rides", "k-1", rideBody))
		},
		status: http.StatusMethodNotAllowed, problem: idemhttp.ProblemMethodNotAllowed, stripeType: idemhttp.StripeInvalidRequestError,
		header: map[string]string{"Allow": "POST"},
		check: func(t *testing.T, b *bundle, res *httptest.ResponseRecorder) {
			require.Equal(t, "PATCH is not supported here: use POST.", decodeProblem(t, res).Detail)
			require.Nil(t, b.keyRow(t, "k-1"), "a refused method records nothing")
			require.Equal(t, map[string]int{"ride_created": 1, "charge_created": 1, "responded": 1}, b.counts.Get(), "only the POST ran")
		},
	},

	// Body over the limit / malformed JSON: 413 / 400 before any key is
	// written.
	{
		name: "body over the limit",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			h := b.handler(t, func(c *idemhttp.Config[rideInput]) { c.MaxBodyBytes = 32 })
			return post(h, "k-1", `{"origin": "`+strings.Repeat("x", 32)+`", "amount": 20}`)
		},
		status: http.StatusRequestEntityTooLarge, problem: idemhttp.ProblemBodyTooLarge, stripeType: idemhttp.StripeInvalidRequestError,
		check: nothingWritten,
	},
	{
		name: "body over the limit without Content-Length",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			h := b.handler(t, func(c *idemhttp.Config[rideInput]) { c.MaxBodyBytes = 32 })
			r := request("k-1", `{"origin": "`+strings.Repeat("x", 32)+`", "amount": 20}`)
			r.ContentLength = -1
			return serve(h, r)
		},
		status: http.StatusRequestEntityTooLarge, problem: idemhttp.ProblemBodyTooLarge, stripeType: idemhttp.StripeInvalidRequestError,
		check: nothingWritten,
	},
	{
		name: "malformed JSON",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			return post(b.handler(t, nil), "k-1", `{"origin": "SFO",`)
		},
		status: http.StatusBadRequest, problem: idemhttp.ProblemMalformedJSON, stripeType: idemhttp.StripeInvalidRequestError,
		check: nothingWritten,
	},
	{
		name: "invalid JSON syntax",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			return post(b.handler(t, nil), "k-1", `{origin: SFO}`)
		},
		status: http.StatusBadRequest, problem: idemhttp.ProblemMalformedJSON, stripeType: idemhttp.StripeInvalidRequestError,
		check: nothingWritten,
	},
	{
		name:   "empty body",
		serve:  func(t *testing.T, b *bundle) *httptest.ResponseRecorder { return post(b.handler(t, nil), "k-1", "") },
		status: http.StatusBadRequest, problem: idemhttp.ProblemMalformedJSON, stripeType: idemhttp.StripeInvalidRequestError,
		check: nothingWritten,
	},
	{
		name: "two JSON values",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			return post(b.handler(t, nil), "k-1", rideBody+rideBody)
		},
		status: http.StatusBadRequest, problem: idemhttp.ProblemMalformedJSON, stripeType: idemhttp.StripeInvalidRequestError,
		check: nothingWritten,
	},

	// Well-formed JSON that does not fit: 422 (Stripe 400) naming the field.
	{
		name: "a string where a number belongs",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			return post(b.handler(t, nil), "k-1", `{"origin": "SFO", "amount": "twenty"}`)
		},
		status: http.StatusUnprocessableEntity, stripeStatus: http.StatusBadRequest,
		problem: idemhttp.ProblemInvalidInput, stripeType: idemhttp.StripeInvalidRequestError,
		check: func(t *testing.T, b *bundle, res *httptest.ResponseRecorder) {
			b.requireNothingWritten(t)
			p := decodeProblem(t, res)
			require.Equal(t, []idemhttp.FieldError{{Field: "amount", Detail: "must be a number, not a string"}}, p.Errors)
			if b.profile == idemhttp.ProfileStripe {
				require.Equal(t, "amount", p.Error.Param)
			}
		},
	},
	{
		name: "a fraction where an integer belongs",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			return post(b.handler(t, nil), "k-1", `{"origin": "SFO", "amount": 1.5}`)
		},
		status: http.StatusUnprocessableEntity, stripeStatus: http.StatusBadRequest,
		problem: idemhttp.ProblemInvalidInput, stripeType: idemhttp.StripeInvalidRequestError,
		check: func(t *testing.T, b *bundle, res *httptest.ResponseRecorder) {
			b.requireNothingWritten(t)
			require.Equal(t, []idemhttp.FieldError{{Field: "amount", Detail: "must be an integer from -9223372036854775808 to 9223372036854775807, not 1.5"}},
				decodeProblem(t, res).Errors)
		},
	},
	{
		name: "an unknown field",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			return post(b.handler(t, nil), "k-1", `{"origin": "SFO", "amount": 20, "amout": 20}`)
		},
		status: http.StatusUnprocessableEntity, stripeStatus: http.StatusBadRequest,
		problem: idemhttp.ProblemInvalidInput, stripeType: idemhttp.StripeInvalidRequestError,
		check: func(t *testing.T, b *bundle, res *httptest.ResponseRecorder) {
			b.requireNothingWritten(t)
			require.Equal(t, []idemhttp.FieldError{{Field: "amout", Detail: "is not a known field"}}, decodeProblem(t, res).Errors)
		},
	},
	{
		name: "an array where an object belongs",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			return post(b.handler(t, nil), "k-1", `[1, 2]`)
		},
		status: http.StatusUnprocessableEntity, stripeStatus: http.StatusBadRequest,
		problem: idemhttp.ProblemInvalidInput, stripeType: idemhttp.StripeInvalidRequestError,
		check: func(t *testing.T, b *bundle, res *httptest.ResponseRecorder) {
			b.requireNothingWritten(t)
			require.Equal(t, "The request body must be an object, not an array.", decodeProblem(t, res).Detail)
		},
	},
	{
		name: "numbers out of range name the range",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			type place struct {
				Lat  float64 `json:"lat"`
				Seat uint8   `json:"seat"`
			}
			type quote struct {
				Lat   float64 `json:"lat"`
				Scale float32 `json:"scale"`
				Count int64   `json:"count"`
				From  place   `json:"from"`
			}
			flow := idem.MustNewFlow("rides.numbers", []idem.Phase[quote]{{
				Name: "responded",
				Do: func(context.Context, idem.Tx, *idem.Attempt[quote]) (idem.Result, error) {
					return idem.RespondJSON(http.StatusOK, nil), nil
				},
			}}, nil)
			h, err := idemhttp.New(b.runnerWith(t, flow), flow, &idemhttp.Config[quote]{Scope: bearerScope, Profile: b.profile})
			require.NoError(t, err)
			for body, want := range map[string]idemhttp.FieldError{
				`{"scale": 1e39}`:        {Field: "scale", Detail: "must be a number from -3.4028235e+38 to 3.4028235e+38, not 1e39"},
				`{"count": 1.5}`:         {Field: "count", Detail: "must be an integer from -9223372036854775808 to 9223372036854775807, not 1.5"},
				`{"from": {"seat": -1}}`: {Field: "from.seat", Detail: "must be an integer from 0 to 255, not -1"},
				`{"from": 7}`:            {Field: "from", Detail: "must be an object, not a number"},
				`{"from": [7]}`:          {Field: "from", Detail: "must be an object, not an array"},
			} {
				res := post(h, "k-1", body)
				require.Equal(t, []idemhttp.FieldError{want}, decodeProblem(t, res).Errors, body)
			}
			return post(h, "k-1", `{"lat": 1e400}`)
		},
		status: http.StatusUnprocessableEntity, stripeStatus: http.StatusBadRequest,
		problem: idemhttp.ProblemInvalidInput, stripeType: idemhttp.StripeInvalidRequestError,
		check: func(t *testing.T, b *bundle, res *httptest.ResponseRecorder) {
			require.Zero(t, b.countRows(t, "idem_keys"))
			require.Equal(t, []idemhttp.FieldError{{Field: "lat", Detail: "must be a number from -1.7976931348623157e+308 to 1.7976931348623157e+308, not 1e400"}},
				decodeProblem(t, res).Errors)
		},
	},
	{
		name: "a null body",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			return post(b.handler(t, nil), "k-1", ` null `)
		},
		status: http.StatusUnprocessableEntity, stripeStatus: http.StatusBadRequest,
		problem: idemhttp.ProblemInvalidInput, stripeType: idemhttp.StripeInvalidRequestError,
		check: nothingWritten,
	},
	{
		name: "failed validation",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			return post(b.handler(t, nil), "k-1", `{"amount": -3}`)
		},
		status: http.StatusUnprocessableEntity, stripeStatus: http.StatusBadRequest,
		problem: idemhttp.ProblemInvalidInput, stripeType: idemhttp.StripeInvalidRequestError,
		check: func(t *testing.T, b *bundle, res *httptest.ResponseRecorder) {
			b.requireNothingWritten(t)
			p := decodeProblem(t, res)
			require.Equal(t, []idemhttp.FieldError{
				{Field: "origin", Detail: "is required"},
				{Field: "amount", Detail: "must be positive"},
			}, p.Errors)
			require.Equal(t, "The request body is invalid: origin is required; amount must be positive.", p.Detail)
			if b.profile == idemhttp.ProfileStripe {
				require.Equal(t, "origin", p.Error.Param)
			}
		},
	},

	{
		name: "a NUL character in a string",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			return post(b.handler(t, nil), "k-1", `{"origin": "S\u0000FO", "amount": 20}`)
		},
		status: http.StatusUnprocessableEntity, stripeStatus: http.StatusBadRequest,
		problem: idemhttp.ProblemInvalidInput, stripeType: idemhttp.StripeInvalidRequestError,
		check: nothingWritten,
	},
	{
		name: "an escaped backslash before u0000 is just text",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			return post(b.handler(t, nil), "k-1", `{"origin": "S\\u0000FO", "amount": 20}`)
		},
		status: http.StatusCreated,
		check: func(t *testing.T, b *bundle, res *httptest.ResponseRecorder) {
			b.requireFinished(t, "k-1", res)
			var origin string
			require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT origin FROM rides`).Scan(&origin))
			require.Equal(t, `S\u0000FO`, origin)
		},
	},
	{
		name: "PATCH through the middleware, without a mux pattern, records the path as sent",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			r := httptest.NewRequest(http.MethodPatch, "/rides/a%00b%2Fc%C3%A9", strings.NewReader(rideBody))
			r.Header.Set("Authorization", testAuth)
			r.Header.Set("Idempotency-Key", "k-1")
			return serve(b.handler(t, nil).Middleware(http.NotFoundHandler()), r)
		},
		status: http.StatusCreated,
		check: func(t *testing.T, b *bundle, res *httptest.ResponseRecorder) {
			b.requireFinished(t, "k-1", res)
			row := b.keyRow(t, "k-1")
			require.Equal(t, "PATCH", row.Method)
			require.Equal(t, "/rides/a%00b%2Fc%C3%A9", row.Path)
		},
	},

	// Bodies the handler cannot read: 415.
	{
		name: "a multipart body",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			r := request("k-1", "--x\r\n\r\norigin=SFO\r\n--x--")
			r.Header.Set("Content-Type", "multipart/form-data; boundary=x")
			return serve(b.handler(t, nil), r)
		},
		status: http.StatusUnsupportedMediaType, problem: idemhttp.ProblemUnsupportedMediaType, stripeType: idemhttp.StripeInvalidRequestError,
		check: nothingWritten,
	},
	{
		name: "a JSON body in Latin-1",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			r := request("k-1", rideBody)
			r.Header.Set("Content-Type", "application/json; charset=iso-8859-1")
			return serve(b.handler(t, nil), r)
		},
		status: http.StatusUnsupportedMediaType, problem: idemhttp.ProblemUnsupportedMediaType, stripeType: idemhttp.StripeInvalidRequestError,
		check: nothingWritten,
	},
	{
		name: "a gzipped body",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			r := request("k-1", rideBody)
			r.Header.Set("Content-Encoding", "gzip")
			return serve(b.handler(t, nil), r)
		},
		status: http.StatusUnsupportedMediaType, problem: idemhttp.ProblemUnsupportedMediaType, stripeType: idemhttp.StripeInvalidRequestError,
		header: map[string]string{"Accept-Encoding": "identity"},
		check:  nothingWritten,
	},
	{
		name: "a +json media type and no Content-Type are read as JSON",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			h := b.handler(t, nil)
			r := request("k-1", rideBody)
			r.Header.Set("Content-Type", "application/vnd.rides+json; charset=UTF-8")
			require.Equal(t, http.StatusCreated, serve(h, r).Code)
			r = request("k-1", rideBody)
			r.Header.Del("Content-Type")
			return serve(h, r)
		},
		status: http.StatusCreated, header: map[string]string{"Idempotent-Replayed": "true"},
		check: func(t *testing.T, b *bundle, res *httptest.ResponseRecorder) { b.requireFinished(t, "k-1", res) },
	},

	// Authentication and the developer's hooks.
	{
		name: "unauthenticated",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			r := request("k-1", rideBody)
			r.Header.Del("Authorization")
			return serve(b.handler(t, nil), r)
		},
		status: http.StatusUnauthorized, problem: idemhttp.ProblemUnauthenticated, stripeType: idemhttp.StripeInvalidRequestError,
		header: map[string]string{"Www-Authenticate": `Bearer realm="rides"`},
		check:  nothingWritten,
	},
	{
		name: "Scope returns a problem of its own",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			h := b.handler(t, func(c *idemhttp.Config[rideInput]) {
				c.Scope = func(*http.Request) (string, error) {
					return "", &idemhttp.Problem{Status: http.StatusForbidden, Detail: "this account is suspended"}
				}
			})
			return post(h, "k-1", rideBody)
		},
		status: http.StatusForbidden,
		check: func(t *testing.T, b *bundle, res *httptest.ResponseRecorder) {
			b.requireNothingWritten(t)
			p := decodeProblem(t, res)
			require.Equal(t, "about:blank", p.Type)
			require.Equal(t, "Forbidden", p.Title)
			if b.profile == idemhttp.ProfileStripe {
				require.Equal(t, &idemhttp.StripeError{Type: idemhttp.StripeInvalidRequestError, Message: "this account is suspended"}, p.Error)
			}
		},
	},
	{
		name: "Scope panics",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			h := b.handler(t, func(c *idemhttp.Config[rideInput]) {
				c.Scope = func(*http.Request) (string, error) { panic("session store gone") }
			})
			return post(h, "k-1", rideBody)
		},
		status: http.StatusInternalServerError, problem: idemhttp.ProblemInternal, stripeType: idemhttp.StripeAPIError,
		check: nothingWritten,
	},
	{
		name: "Prepare panics",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			h := b.handler(t, func(c *idemhttp.Config[rideInput]) {
				c.Prepare = func(*http.Request, *rideInput) error { panic("user lookup failed") }
			})
			return post(h, "k-1", rideBody)
		},
		status: http.StatusInternalServerError, problem: idemhttp.ProblemInternal, stripeType: idemhttp.StripeAPIError,
		check: nothingWritten,
	},
	// A hook whose own database lookup fails says so by wrapping
	// idem.ErrStoreUnavailable: the answer is the adapter's own 503.
	{
		name: "Scope cannot reach the database",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			h := b.handler(t, func(c *idemhttp.Config[rideInput]) {
				c.Scope = func(*http.Request) (string, error) {
					return "", fmt.Errorf("look up the session: %w: connection refused", idem.ErrStoreUnavailable)
				}
			})
			return post(h, "k-1", rideBody)
		},
		status: http.StatusServiceUnavailable, problem: idemhttp.ProblemStoreUnavailable, stripeType: idemhttp.StripeAPIError,
		header: map[string]string{"Retry-After": "5"},
		check:  nothingWritten,
	},
	{
		name: "Prepare cannot reach the database",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			h := b.handler(t, func(c *idemhttp.Config[rideInput]) {
				c.UnavailableRetryAfter = 7 * time.Second
				c.Prepare = func(*http.Request, *rideInput) error {
					return fmt.Errorf("look up the user: %w", idem.ErrStoreUnavailable)
				}
			})
			return post(h, "k-1", rideBody)
		},
		status: http.StatusServiceUnavailable, problem: idemhttp.ProblemStoreUnavailable, stripeType: idemhttp.StripeAPIError,
		header: map[string]string{"Retry-After": "7"},
		check:  nothingWritten,
	},
	{
		name: "Prepare fails",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			h := b.handler(t, func(c *idemhttp.Config[rideInput]) {
				c.Prepare = func(*http.Request, *rideInput) error { return errors.New("user lookup failed") }
			})
			return post(h, "k-1", rideBody)
		},
		status: http.StatusInternalServerError, problem: idemhttp.ProblemInternal, stripeType: idemhttp.StripeAPIError,
		check: nothingWritten,
	},
	{
		name: "Validate panics",
		serve: func(t *testing.T, b *bundle) *httptest.ResponseRecorder {
			h := b.handler(t, func(c *idemhttp.Config[rideInput]) {
				c.Validate = func(*rideInput) []idemhttp.FieldError { panic("index out of range") }
			})
			return post(h, "k-1", rideBody)
		},
		status: http.StatusInternalServerError, problem: idemhttp.ProblemInternal, stripeType: idemhttp.StripeAPIError,
		check: nothingWritten,
	},
}

// TestContract walks every row of the HTTP contract in both profiles
// through the handler against Postgres.
func TestContract(t *testing.T) {
	t.Parallel()
	for _, profile := range []idemhttp.Profile{idemhttp.ProfileIETF, idemhttp.ProfileStripe} {
		for _, tc := range contractCases {
			t.Run(profile.String()+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t, profile)
				res := tc.serve(t, b)

				want := tc.status
				if profile == idemhttp.ProfileStripe && tc.stripeStatus != 0 {
					want = tc.stripeStatus
				}
				require.Equal(t, want, res.Code, "body: %s", res.Body)
				for name, value := range tc.header {
					if value == "" {
						require.NotContains(t, res.Header(), http.CanonicalHeaderKey(name))
						continue
					}
					require.Equal(t, []string{value}, res.Header().Values(name), name)
				}

				if tc.problem != "" {
					p := decodeProblem(t, res)
					require.Equal(t, idemhttp.ProblemTypeBaseDefault+tc.problem, p.Type)
					require.Equal(t, wantTitles[tc.problem], p.Title)
					require.Equal(t, want, p.Status)
					require.NotEmpty(t, p.Detail)
					require.NotContains(t, res.Header(), "Idempotent-Replayed")
					if profile == idemhttp.ProfileStripe {
						require.NotNil(t, p.Error, "the Stripe profile adds the error member")
						require.Equal(t, tc.stripeType, p.Error.Type)
						require.Equal(t, tc.stripeCode, p.Error.Code)
						require.Equal(t, p.Detail, p.Error.Message)
					} else {
						require.Nil(t, p.Error, "the IETF profile is plain RFC 9457")
					}
				}
				if tc.check != nil {
					tc.check(t, b, res)
				}
			})
		}
	}
}
