// Package idemhttp serves an idem flow over HTTP with the Idempotency-Key
// contract: the IETF draft (draft-ietf-httpapi-idempotency-key-header) by
// default, or Stripe's API conventions.
//
// A [Handler] is a plain http.Handler, so it works with http.ServeMux and
// with any router that takes one (chi, gorilla/mux, and echo's and gin's
// net/http adapters):
//
//	rides, err := idemhttp.New(runner, createRide, &idemhttp.Config[RideParams]{
//		Scope: func(r *http.Request) (string, error) {
//			user, err := auth.User(r)
//			if err != nil {
//				return "", idemhttp.ErrUnauthenticated
//			}
//			return "user:" + user.ID, nil
//		},
//	})
//	mux.Handle("POST /rides", rides)
//	mux.Handle("/rides", rides.MethodNotAllowed(http.MethodPost)) // GET, PATCH...: a 405 problem
//	// or, sharing the path with the resource's other methods:
//	mux.Handle("/rides", rides.Middleware(listRides))
//
// # From request to runner
//
// For a POST or PATCH, the handler does, in order, and stops at the first
// refusal. Every refusal happens before any key is written, so bad input
// leaves no trace in the key store:
//
//  1. Scope: Config.Scope derives the owner of the key (tenant or user)
//     from the authenticated request; an error is a 401 (one wrapping
//     idem.ErrStoreUnavailable a 503). There is no default: the same key
//     sent by two callers must be two requests.
//  2. Key: the Idempotency-Key header, as an RFC 9651 sf-string ("abc") or
//     a bare token (abc, as Stripe's clients send it); see [ParseKey]. A
//     missing or malformed key is a 400.
//  3. Body: a JSON media type (or none) and no content coding, else 415; at
//     most Config.MaxBodyBytes, else 413; exactly one well-formed JSON
//     value, else 400; a value that fits the input type, else 422 naming
//     the field (a string where a number belongs, an unknown member).
//  4. Config.Prepare sets server-derived fields; Config.Validate returns
//     field errors, a 422 listing them.
//  5. Run: the runner fingerprints what the client sent (the flow name, the
//     request target and the canonical JSON of the body as sent, not the
//     decoded input), acquires the key and resumes or replays. The key is
//     bound to the fingerprint and to the endpoint: the method and the
//     route (the ServeMux pattern that matched, else the path), so the same
//     key elsewhere is a mismatch. A deploy that changes the input type or
//     Prepare does not change a retry's fingerprint; a body that step 3 or
//     4 refuses with a 422 is first tried as a retry of the key its bytes
//     made (idem.Request.RetryOnly), which replays or resumes it.
//
// GET, HEAD, PUT, DELETE, OPTIONS and every other method need no key:
// [Handler.Middleware] hands them to the next handler untouched, and the
// Handler alone answers them 405 with Allow: POST, PATCH.
//
// # From outcome to response
//
// The runner's [idem.Outcome] becomes the response:
//
//	executed           the flow's response: status, body, allowed headers
//	replayed           the stored response, byte for byte, and Idempotent-Replayed: true
//	in progress        409 + Retry-After: the time left on the holder's lease, capped by the runner's MaxRetryAfter (2 s),
//	                   after waiting Config.DefaultWait (5 s) for the attempt to end, or, with Prefer: wait=N, that
//	                   long, at most Config.MaxWait or DefaultWait (Preference-Applied: wait=N); an attempt that does end answers as
//	                   a retry then would; in the Stripe profile 429 lock_timeout after a wait, which the Stripe SDKs retry
//	                   (202 Accepted + Retry-After instead with Config.InProgress InProgressAccepted, or to a request that
//	                   preferred respond-async: see Long requests below)
//	lock lost          409 + Retry-After: 1; another worker took the request over and owns it now
//	mismatch           422 (Stripe: 400 idempotency_error): the key was used for another request
//	too many keys      429 + Retry-After: the runner's Config.Admit refused a new key; nothing stored
//	needs reconcile    503 + Retry-After (Config.ReconcileRetryAfter, 60 s)
//	store unavailable  503 + Retry-After (Config.UnavailableRetryAfter, 5 s); fail closed
//	failed             500: a phase returned an error or panicked; no response stored, committed phases kept, key released
//
// A replay is byte-identical to the first response in status, body and the
// allowed headers: Content-Type and Config.ReplayHeaders. Any other header
// a phase sets is dropped from the first response too, and credentials,
// cookies and hop-by-hop headers can never be allowed.
//
// No 409, 5xx or 4xx answer is stored as the key's response: only a
// phase's response is. A 500 or 503 leaves the key bound to its endpoint and
// payload with the phases that committed, so a client retries a 409, 500 or
// 503 with the same key and the same body, and gets either the stored
// response or the request resumed from its last committed phase; the same
// key with another body is refused. A client that got a 4xx fixes the
// request first. A key waiting for reconciliation is 503 rather than 409 because
// no worker is running it: it needs the reconcile service or an operator,
// which is a server-side condition a client can only wait out, and a 5xx
// makes it visible to monitoring.
//
// The flow runs to completion even if the client disconnects: a retry then
// replays instead of resuming a half-done request. The request's context
// values (auth, trace spans) still reach the phases.
//
// A phase response is replayed until its key expires: Config.Retention of
// the runner, 24 h by default, or the flow's FlowConfig.Retention. After
// that the same key is a new request, whether or not the reaper has deleted
// the expired key yet.
//
// # Long requests
//
// With Config.RespondAsync, a request sent with "Prefer: respond-async"
// (RFC 7240) is answered 202 Accepted once its key is held, with the
// Location of the handler's status monitor ([Handler.Monitor], mounted by
// the application at Config.MonitorURL behind its own authentication),
// and its flow goes on without the client. The monitor answers 202 while
// the request runs, then its stored response; a key of another scope is
// 404. Runs without a client (answered 202, or whose client went away) are
// bounded per process by a [DetachedRuns]. docs/http.md, "Long requests",
// has the states and the client's recipe.
//
// # Webhooks
//
// [NewWebhook] serves a flow the other way round, as the receiver of a
// provider's webhook deliveries (Stripe, GitHub): the provider's event id
// is the key, scoped to the provider and its account, the signature is
// checked by WebhookConfig.Verify before anything is stored, a redelivery
// of a finished event gets the stored response without running anything,
// one while the event runs a 503 (which a provider that redelivers, such as
// Stripe, delivers again), and the same
// event id with another body a 422. docs/webhooks.md has the contract.
//
// # Errors
//
// Every error the adapter writes is an RFC 9457 application/problem+json
// [Problem] with a stable type URI (Config.ProblemTypeBase followed by one
// of the Problem* names) and title. The Stripe profile keeps those members
// and adds Stripe's "error" object ({"type", "code", "message", "param"}),
// so Stripe clients can read it. Config.Scope and Config.Prepare may return
// a *Problem to answer with it, and [WriteProblem] writes one for an
// application's own errors. docs/http.md lists every problem type with an
// example response.
package idemhttp
