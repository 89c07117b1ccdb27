// Package fakepay is an in-memory payment provider with a Stripe-shaped API,
// built so the rides example can prove that every ride was charged exactly
// once, and so that it can be made to misbehave on purpose.
//
// rocket-rides-atomic charges rides through Stripe with an idempotency key.
// Stripe is not available to a demo or a test, and even if it were, it
// would not let us count charges cheaply or inject the faults that make
// idempotency interesting. fakepay keeps every charge in a ledger that
// anyone can list (GET /v1/charges), which turns "exactly once" into a
// query: one ledger entry per ride, never two.
//
// # API
//
//	POST /v1/charges       create a charge (JSON or form-encoded body)
//	GET  /v1/charges       the whole ledger, in creation order
//	GET  /v1/charges/{id}  one charge
//
// A charge request carries amount (minor units, > 0), currency (three
// letters), customer and an optional description, plus an optional
// Idempotency-Key header of at most 255 printable ASCII characters.
// Responses follow Stripe's shapes: a charge object on success, and
// {"error":{"type":...,"code":...,"message":...}} otherwise, with type
// card_error (402, a declined customer), invalid_request_error (400),
// idempotency_error (400, a key reused with different parameters) or
// api_error (500, an injected failure).
//
// # Idempotency
//
// Like Stripe, the server stores the result of a request under its key and
// returns the same result, byte for byte and marked with the header
// Idempotent-Replayed: true, to every later request with that key. Requests
// with the same key are serialised: a second request that arrives while the
// first is still being handled waits for it and gets its result, so a key
// can never charge twice. Requests with different keys don't wait for each
// other. Declines (402) are stored like charges. Injected failures (500) are
// not, so a retry with the same key may go on to charge. Requests without a
// key are not deduplicated at all: each one that succeeds is a new charge.
//
// # Faults
//
// Config.FailRate answers 500 before anything happens. Config.DropRate is
// the nasty one: the charge is made and stored, then the TCP connection is
// closed without a response. The caller sees a transport error and cannot
// tell whether it was charged; only a retry with the same idempotency key
// finds out, and gets the original charge back. This is the failure that
// makes idempotency keys necessary, and the reason Client callers must
// always send one.
//
// # Running it
//
// A *Server is an http.Handler; serve it however suits:
//
//	srv, err := fakepay.New(&fakepay.Config{FailRate: 0.05, DropRate: 0.05})
//	if err != nil {
//		return err
//	}
//	return http.ListenAndServe("127.0.0.1:5100", srv)
//
// and talk to it with a Client:
//
//	client := &fakepay.Client{BaseURL: "http://127.0.0.1:5100"}
//	charge, err := client.CreateCharge(ctx, downstreamKey, fakepay.ChargeParams{
//		Amount: 20_00, Currency: "usd", Customer: "cus_123",
//	})
//	switch {
//	case err == nil:
//		// charged: record charge.ID
//	case fakepay.IsPermanent(err):
//		// a decline or a bad request: retrying won't change it, store the outcome
//	default:
//		// outcome unknown or a transient failure: retry later with the same key
//	}
//
// The ledger lives in memory and is lost when the process exits; so are
// the stored idempotency results, which are never expired.
package fakepay
