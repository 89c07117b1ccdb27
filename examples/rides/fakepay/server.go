package fakepay

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mathrand "math/rand/v2"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// maxRequestBodyBytes bounds a charge request body; real ones are a few
// hundred bytes.
const maxRequestBodyBytes = 64 << 10

// Server is the fake payment provider. It is an http.Handler and safe for
// concurrent use. Create one with New.
type Server struct {
	config   *Config
	logger   *slog.Logger
	mux      *http.ServeMux
	declined map[string]struct{}
	faults   *faultSource
	keys     keyStore
	ledger   ledger
}

// New returns a Server configured by cfg, which may be nil for defaults.
// It returns an error wrapping ErrInvalidConfig if cfg is invalid.
func New(cfg *Config) (*Server, error) {
	config := cfg.WithDefaults()
	if err := config.validate(); err != nil {
		return nil, err
	}

	s := &Server{
		config:   config,
		logger:   config.Logger,
		mux:      http.NewServeMux(),
		declined: make(map[string]struct{}, len(config.DeclinedCustomers)),
		faults:   newFaultSource(config.Seed),
		keys:     keyStore{entries: make(map[string]*keyEntry)},
		ledger:   ledger{byID: make(map[string]int)},
	}
	for _, customer := range config.DeclinedCustomers {
		s.declined[customer] = struct{}{}
	}

	s.mux.HandleFunc("POST /v1/charges", s.handleCreateCharge)
	s.mux.HandleFunc("GET /v1/charges", s.handleListCharges)
	s.mux.HandleFunc("GET /v1/charges/{id}", s.handleGetCharge)
	s.mux.HandleFunc("/", s.handleNotFound)
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.config.Latency > 0 {
		timer := time.NewTimer(s.config.Latency)
		select {
		case <-timer.C:
		case <-r.Context().Done():
			// The client gave up while "the provider" was busy: nothing
			// happened yet, and nobody is left to answer.
			timer.Stop()
			return
		}
	}
	s.mux.ServeHTTP(w, r)
}

// Charges returns a copy of the ledger in creation order, for in-process
// audits. Over HTTP the same list is at GET /v1/charges.
func (s *Server) Charges() []Charge {
	return s.ledger.list()
}

func (s *Server) handleCreateCharge(w http.ResponseWriter, r *http.Request) {
	key, hasKey, err := idempotencyKeyFromRequest(r)
	if err != nil {
		writeParamError(w, err)
		return
	}

	params, err := decodeChargeParams(w, r)
	if err != nil {
		writeParamError(w, err)
		return
	}

	logger := s.logger.With(slog.String("idempotency_key", key))

	// Decided before the key is consulted, as an outage would be: a failed
	// request never reaches the point where a result could be stored.
	if s.faults.happens(s.config.FailRate) {
		logger.InfoContext(r.Context(), "fakepay: injected failure")
		writeError(w, http.StatusInternalServerError, errorDetail{
			Type:    ErrorTypeAPI,
			Message: "An injected error occurred while processing the charge. Retry with the same Idempotency-Key.",
		})
		return
	}

	if !hasKey {
		resp := s.chargeOrDecline(r.Context(), logger, "", params)
		s.respond(w, r, logger, resp)
		return
	}

	entry := s.keys.entry(key)
	if err := entry.lock(r.Context()); err != nil {
		// The client went away while an earlier request with its key was in
		// flight. Nothing was done on its behalf, and there is nobody to
		// answer.
		return
	}
	defer entry.unlock()

	if stored := entry.stored; stored != nil {
		if stored.params != params {
			writeError(w, http.StatusBadRequest, errorDetail{
				Type: ErrorTypeIdempotency,
				Message: fmt.Sprintf("Keys for idempotent requests can only be used with the same parameters they were first used with. "+
					"Try using a key other than %q if you meant to execute a different request.", key),
			})
			return
		}
		logger.DebugContext(r.Context(), "fakepay: replaying stored response", slog.Int("status", stored.status))
		w.Header().Set("Idempotent-Replayed", "true")
		writeJSONBytes(w, stored.status, stored.body)
		return
	}

	resp := s.chargeOrDecline(r.Context(), logger, key, params)
	entry.stored = &storedResponse{params: params, response: resp}
	s.respond(w, r, logger, resp)
}

// response is a finished charge request: what is sent, and what is stored
// under its idempotency key.
type response struct {
	status  int
	body    []byte
	charged bool
}

type storedResponse struct {
	params ChargeParams
	response
}

// chargeOrDecline makes the decision a real provider makes, and records a
// charge in the ledger when the answer is yes.
func (s *Server) chargeOrDecline(ctx context.Context, logger *slog.Logger, key string, params ChargeParams) response {
	if hook := s.config.Test.BeforeCharge; hook != nil {
		hook(ctx, key)
	}

	if _, declined := s.declined[params.Customer]; declined {
		logger.InfoContext(ctx, "fakepay: charge declined", slog.String("customer", params.Customer))
		return response{
			status: http.StatusPaymentRequired,
			body: mustMarshal(errorBody{Error: errorDetail{
				Type:    ErrorTypeCard,
				Code:    "card_declined",
				Message: "Your card was declined.",
			}}),
		}
	}

	charge := s.ledger.add(key, params)
	logger.InfoContext(ctx, "fakepay: charge created",
		slog.String("charge_id", charge.ID),
		slog.String("customer", charge.Customer),
		slog.Int64("amount", charge.Amount),
		slog.String("currency", charge.Currency),
	)
	return response{status: http.StatusOK, body: mustMarshal(charge), charged: true}
}

// respond sends resp, or, when the dice say so and a charge was just made,
// drops the connection instead.
func (s *Server) respond(w http.ResponseWriter, r *http.Request, logger *slog.Logger, resp response) {
	if resp.charged && s.faults.happens(s.config.DropRate) {
		logger.InfoContext(r.Context(), "fakepay: dropping connection after charging")
		dropConnection(w)
		return
	}
	writeJSONBytes(w, resp.status, resp.body)
}

// dropConnection closes the client's TCP connection without writing a
// byte, so the client can't tell whether its request did anything.
func dropConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// HTTP/2 and some wrapped writers can't be hijacked. Aborting the
		// handler is net/http's own way to cut a response off: it resets
		// the stream or closes the connection, without logging a panic.
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}

func (s *Server) handleListCharges(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, chargeList{Object: "list", Data: s.ledger.list()})
}

func (s *Server) handleGetCharge(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	charge, ok := s.ledger.get(id)
	if !ok {
		writeError(w, http.StatusNotFound, errorDetail{
			Type:    ErrorTypeInvalidRequest,
			Code:    "resource_missing",
			Param:   "id",
			Message: fmt.Sprintf("No such charge: %q", id),
		})
		return
	}
	writeJSON(w, http.StatusOK, charge)
}

func (s *Server) handleNotFound(w http.ResponseWriter, r *http.Request) {
	writeError(w, http.StatusNotFound, errorDetail{
		Type:    ErrorTypeInvalidRequest,
		Message: fmt.Sprintf("Unrecognized request URL (%s: %s).", r.Method, r.URL.Path),
	})
}

// idempotencyKeyFromRequest reports the request's key and whether it sent
// one. A header that is present but empty is an error rather than "no key":
// silently dropping idempotency because of a client bug is what this
// provider exists to catch.
func idempotencyKeyFromRequest(r *http.Request) (string, bool, error) {
	values := r.Header.Values("Idempotency-Key")
	switch len(values) {
	case 0:
		return "", false, nil
	case 1:
		if err := validateIdempotencyKey(values[0]); err != nil {
			return "", false, err
		}
		return values[0], true, nil
	default:
		return "", false, &paramError{"Idempotency-Key", "Idempotency-Key must be sent once"}
	}
}

// decodeChargeParams reads a JSON or form-encoded charge request. Unknown
// parameters are rejected, as Stripe does, so a typo can't silently change
// what is charged.
func decodeChargeParams(w http.ResponseWriter, r *http.Request) (ChargeParams, error) {
	r.Body = http.MaxBytesReader(w, r.Body, maxRequestBodyBytes)

	mediaType, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		return ChargeParams{}, &paramError{"Content-Type", "Content-Type must be application/json or application/x-www-form-urlencoded"}
	}

	var params ChargeParams
	switch mediaType {
	case "application/json":
		params, err = decodeJSONParams(r.Body)
	case "application/x-www-form-urlencoded":
		params, err = decodeFormParams(r)
	default:
		return ChargeParams{}, &paramError{"Content-Type", fmt.Sprintf("Content-Type must be application/json or application/x-www-form-urlencoded, got %q", mediaType)}
	}
	if err != nil {
		return ChargeParams{}, err
	}
	return params.normalize()
}

func decodeJSONParams(body io.Reader) (ChargeParams, error) {
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()

	var params ChargeParams
	if err := dec.Decode(&params); err != nil {
		return ChargeParams{}, &paramError{"", fmt.Sprintf("Invalid JSON body: %v", err)}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return ChargeParams{}, &paramError{"", "Invalid JSON body: unexpected data after the object"}
	}
	return params, nil
}

func decodeFormParams(r *http.Request) (ChargeParams, error) {
	if err := r.ParseForm(); err != nil {
		return ChargeParams{}, &paramError{"", fmt.Sprintf("Invalid form body: %v", err)}
	}

	var params ChargeParams
	for name, values := range r.PostForm {
		if len(values) != 1 {
			return ChargeParams{}, &paramError{name, fmt.Sprintf("Parameter %q must be sent once", name)}
		}
		value := values[0]
		switch name {
		case "amount":
			amount, err := strconv.ParseInt(value, 10, 64)
			if err != nil {
				return ChargeParams{}, &paramError{"amount", fmt.Sprintf("amount must be an integer, got %q", value)}
			}
			params.Amount = amount
		case "currency":
			params.Currency = value
		case "customer":
			params.Customer = value
		case "description":
			params.Description = value
		default:
			return ChargeParams{}, &paramError{name, fmt.Sprintf("Received unknown parameter: %s", name)}
		}
	}
	return params, nil
}

func writeParamError(w http.ResponseWriter, err error) {
	detail := errorDetail{Type: ErrorTypeInvalidRequest, Message: err.Error()}
	var pe *paramError
	if errors.As(err, &pe) {
		detail.Param = pe.param
	}
	writeError(w, http.StatusBadRequest, detail)
}

func writeError(w http.ResponseWriter, status int, detail errorDetail) {
	writeJSON(w, status, errorBody{Error: detail})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	writeJSONBytes(w, status, mustMarshal(v))
}

func writeJSONBytes(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// mustMarshal encodes values whose types this package defines, which
// always encode.
func mustMarshal(v any) []byte {
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(v); err != nil {
		panic(fmt.Sprintf("fakepay: encoding %T: %v", v, err))
	}
	return buf.Bytes()
}

// keyStore holds one entry per idempotency key ever seen. Entries are never
// removed: a fake provider's lifetime is a test or a demo run.
type keyStore struct {
	mu      sync.Mutex
	entries map[string]*keyEntry
}

func (ks *keyStore) entry(key string) *keyEntry {
	ks.mu.Lock()
	defer ks.mu.Unlock()

	e, ok := ks.entries[key]
	if !ok {
		e = &keyEntry{sem: make(chan struct{}, 1)}
		ks.entries[key] = e
	}
	return e
}

// keyEntry serialises the requests for one key. The lock is a channel
// rather than a sync.Mutex so a waiter whose client hangs up stops waiting.
type keyEntry struct {
	sem chan struct{}

	// stored is the result to replay for the key. Guarded by sem.
	stored *storedResponse
}

func (e *keyEntry) lock(ctx context.Context) error {
	select {
	case e.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (e *keyEntry) unlock() { <-e.sem }

// ledger is the list of charges made, the audit trail.
type ledger struct {
	mu      sync.Mutex
	charges []Charge
	byID    map[string]int
}

func (l *ledger) add(key string, params ChargeParams) Charge {
	charge := Charge{
		ID:             "ch_" + rand.Text(),
		Object:         "charge",
		Amount:         params.Amount,
		Currency:       params.Currency,
		Customer:       params.Customer,
		Description:    params.Description,
		IdempotencyKey: key,
		Created:        time.Now().Unix(),
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	l.byID[charge.ID] = len(l.charges)
	l.charges = append(l.charges, charge)
	return charge
}

func (l *ledger) list() []Charge {
	l.mu.Lock()
	defer l.mu.Unlock()
	// Never nil, so the JSON list is [] rather than null.
	return append(make([]Charge, 0, len(l.charges)), l.charges...)
}

func (l *ledger) get(id string) (Charge, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i, ok := l.byID[id]
	if !ok {
		return Charge{}, false
	}
	return l.charges[i], true
}

// faultSource decides which requests get injected faults. math/rand's
// generators aren't safe for concurrent use, hence the mutex.
type faultSource struct {
	mu  sync.Mutex
	rng *mathrand.Rand
}

func newFaultSource(seed int64) *faultSource {
	return &faultSource{rng: mathrand.New(mathrand.NewPCG(uint64(seed), uint64(seed)))}
}

// happens reports whether an event of the given probability happens this
// time. Certainties don't consume a draw, so a rate of 0 or 1 leaves the
// sequence of the other rate untouched.
func (f *faultSource) happens(probability float64) bool {
	switch {
	case probability <= 0:
		return false
	case probability >= 1:
		return true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rng.Float64() < probability
}
