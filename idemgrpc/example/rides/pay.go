package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// The fake payment provider: a Stripe-shaped charge endpoint that honours
// its own Idempotency-Key and keeps a ledger anyone can list, so "charged
// exactly once" is a question the ledger answers. It runs in its own process
// (the pay command) or in a test's, never in the rides server's: a server
// killed mid-request must not take the ledger with it.
//
//	POST /charges  {"amount", "currency", "customer", "description"} with an Idempotency-Key header
//	               200 the charge; 402 {"error": "card_declined"} for customer cus_bad_source
//	GET  /charges  the ledger, in order
//
// The same key returns the same answer, and never charges twice; the same
// key with other parameters is a 400.

// declinedCustomer's card is always declined.
const declinedCustomer = "cus_bad_source"

type chargeParams struct {
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency"`
	Customer    string `json:"customer"`
	Description string `json:"description"`
}

type charge struct {
	ID             string `json:"id"`
	IdempotencyKey string `json:"idempotency_key"`
	chargeParams
}

// payments is the provider's HTTP handler.
type payments struct {
	latency time.Duration

	mu     sync.Mutex
	keys   map[string]*payAnswer // by Idempotency-Key; a charge in flight holds its entry's lock
	ledger []charge
	asked  int // charge requests received, answered from the ledger or not
}

type payAnswer struct {
	mu     sync.Mutex
	params chargeParams
	status int
	body   []byte
}

func newPayments(latency time.Duration) *payments {
	return &payments{latency: latency, keys: map[string]*payAnswer{}}
}

func (p *payments) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/charges" && r.Method == http.MethodGet:
		writePayJSON(w, http.StatusOK, p.charges())
	case r.URL.Path == "/charges" && r.Method == http.MethodPost:
		p.createCharge(w, r)
	default:
		http.NotFound(w, r)
	}
}

func (p *payments) createCharge(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	var params chargeParams
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&params); err != nil || key == "" || params.Amount <= 0 || params.Customer == "" {
		writePayJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_request"})
		return
	}
	p.mu.Lock()
	p.asked++
	answer, seen := p.keys[key]
	if !seen {
		answer = &payAnswer{params: params}
		p.keys[key] = answer
	}
	p.mu.Unlock()

	// Requests with one key are served one at a time: the second waits
	// for the first and gets its answer.
	answer.mu.Lock()
	defer answer.mu.Unlock()
	switch {
	case answer.params != params:
		writePayJSON(w, http.StatusBadRequest, map[string]string{"error": "idempotency_key_reused"})
		return
	case answer.status != 0:
		w.Header().Set("Idempotent-Replayed", "true")
		writePayBody(w, answer.status, answer.body)
		return
	}
	if p.latency > 0 {
		select {
		case <-time.After(p.latency):
		case <-r.Context().Done():
			return // nothing charged, nothing stored
		}
	}
	if params.Customer == declinedCustomer {
		answer.status, answer.body = http.StatusPaymentRequired, []byte(`{"error":"card_declined"}`)
	} else {
		p.mu.Lock()
		c := charge{ID: fmt.Sprintf("ch_%d", len(p.ledger)+1), IdempotencyKey: key, chargeParams: params}
		p.ledger = append(p.ledger, c)
		p.mu.Unlock()
		answer.status = http.StatusOK
		answer.body, _ = json.Marshal(c)
	}
	writePayBody(w, answer.status, answer.body)
}

// requests returns how many charge requests the provider received.
func (p *payments) requests() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.asked
}

// charges returns the ledger.
func (p *payments) charges() []charge {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]charge{}, p.ledger...)
}

func writePayJSON(w http.ResponseWriter, status int, v any) {
	body, _ := json.Marshal(v)
	writePayBody(w, status, body)
}

func writePayBody(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// errCardDeclined is the provider's final no.
var errCardDeclined = errors.New("card declined")

// payClient talks to the provider.
type payClient struct {
	baseURL string
	http    *http.Client
}

// createCharge charges p under key. errCardDeclined is a decline; any
// other error leaves the outcome unknown, and the caller retries with the
// same key.
func (c *payClient) createCharge(ctx context.Context, key string, p chargeParams) (*charge, error) {
	body, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+"/charges", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("payments: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("payments: read answer: %w", err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		var ch charge
		if err := json.Unmarshal(raw, &ch); err != nil {
			return nil, fmt.Errorf("payments: decode charge: %w", err)
		}
		return &ch, nil
	case http.StatusPaymentRequired:
		return nil, errCardDeclined
	}
	return nil, fmt.Errorf("payments: HTTP %d: %s", resp.StatusCode, raw)
}
