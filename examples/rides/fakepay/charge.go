package fakepay

import (
	"fmt"
	"strings"
)

// MaxIdempotencyKeyLength is the longest Idempotency-Key the server
// accepts, the same limit as Stripe's.
const MaxIdempotencyKeyLength = 255

const maxCustomerLength = 255

// ChargeParams are the parameters of a charge request.
type ChargeParams struct {
	// Amount is in the currency's minor unit (cents for usd) and must be
	// greater than zero.
	Amount int64 `json:"amount"`

	// Currency is a three-letter ISO code. The server lowercases it, as
	// Stripe does.
	Currency string `json:"currency"`

	// Customer is the customer to charge. Required.
	Customer string `json:"customer"`

	// Description is free text shown in the ledger. Optional.
	Description string `json:"description,omitempty"`
}

// Charge is a charge in the ledger, shaped like Stripe's charge object.
type Charge struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency"`
	Customer    string `json:"customer"`
	Description string `json:"description"`

	// IdempotencyKey is the key of the request that created the charge,
	// empty when it was sent without one. Stripe keeps this elsewhere; here
	// it is on the charge so an audit can match charges to requests.
	IdempotencyKey string `json:"idempotency_key"`

	// Created is when the charge was made, in Unix seconds.
	Created int64 `json:"created"`
}

// paramError is a request parameter that failed validation, reported as a
// 400 invalid_request_error naming the parameter.
type paramError struct {
	param   string
	message string
}

func (e *paramError) Error() string { return e.message }

// normalize validates the parameters and returns them in the canonical
// form that is charged and compared against a stored request.
func (p ChargeParams) normalize() (ChargeParams, error) {
	if p.Amount <= 0 {
		return ChargeParams{}, &paramError{"amount", fmt.Sprintf("amount must be a positive integer in minor units, got %d", p.Amount)}
	}
	if !isThreeLetters(p.Currency) {
		return ChargeParams{}, &paramError{"currency", fmt.Sprintf("currency must be a three-letter ISO code, got %q", p.Currency)}
	}
	if p.Customer == "" {
		return ChargeParams{}, &paramError{"customer", "customer is required"}
	}
	if len(p.Customer) > maxCustomerLength {
		return ChargeParams{}, &paramError{"customer", fmt.Sprintf("customer must be at most %d characters", maxCustomerLength)}
	}
	p.Currency = strings.ToLower(p.Currency)
	return p, nil
}

func isThreeLetters(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := range len(s) {
		c := s[i] | 0x20 // ASCII lowercase; non-letters stay outside a..z
		if c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

// validateIdempotencyKey checks a key as the server receives it. Keys are
// limited to printable ASCII so they log and compare without surprises.
func validateIdempotencyKey(key string) error {
	if key == "" {
		return &paramError{"Idempotency-Key", "Idempotency-Key must not be empty when present"}
	}
	if len(key) > MaxIdempotencyKeyLength {
		return &paramError{"Idempotency-Key", fmt.Sprintf("Idempotency-Key must be at most %d characters, got %d", MaxIdempotencyKeyLength, len(key))}
	}
	for i := range len(key) {
		if key[i] < 0x20 || key[i] > 0x7e {
			return &paramError{"Idempotency-Key", "Idempotency-Key must contain only printable ASCII characters"}
		}
	}
	return nil
}

// errorBody is the envelope of every error response, as in Stripe's API.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Type    string `json:"type"`
	Code    string `json:"code,omitempty"`
	Param   string `json:"param,omitempty"`
	Message string `json:"message"`
}

// Error types, as in errorDetail.Type.
const (
	ErrorTypeAPI            = "api_error"
	ErrorTypeCard           = "card_error"
	ErrorTypeIdempotency    = "idempotency_error"
	ErrorTypeInvalidRequest = "invalid_request_error"
)

type chargeList struct {
	Object string   `json:"object"`
	Data   []Charge `json:"data"`
}
