package fakepay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// maxResponseBodyBytes bounds what the client reads from the server; the
// ledger of a long simulator run is the largest response.
const maxResponseBodyBytes = 256 << 20

// ErrNoResponse is wrapped by every Client error where no HTTP response
// arrived: connection refused or reset, a dropped connection, a cancelled
// context. The request may or may not have been carried out; with
// Config.DropRate it was, and the charge is in the ledger. The only safe
// reaction is to retry with the same idempotency key, which returns the
// original result if there was one.
var ErrNoResponse = errors.New("fakepay: no response from server, outcome unknown")

// CardError is returned by CreateCharge when the charge is declined (HTTP
// 402). It is permanent: retrying, with the same key or another, gets the
// same answer, so the caller should record the decline as the outcome.
type CardError struct {
	// Code is Stripe's error code, "card_declined".
	Code    string
	Message string
}

func (e *CardError) Error() string {
	return fmt.Sprintf("fakepay: card error (%s): %s", e.Code, e.Message)
}

// APIError is returned for a non-2xx response other than a decline: a bad
// request (400 invalid_request_error), a reused key (400
// idempotency_error), an unknown charge (404) or an injected failure (500
// api_error). IsPermanent tells the caller which of these are worth a retry.
type APIError struct {
	StatusCode int
	// Type is the error type from the response body, one of the ErrorType
	// constants, or empty if the body couldn't be decoded.
	Type    string
	Code    string
	Param   string
	Message string
}

func (e *APIError) Error() string {
	if e.Param != "" {
		return fmt.Sprintf("fakepay: HTTP %d %s (param %s): %s", e.StatusCode, e.Type, e.Param, e.Message)
	}
	return fmt.Sprintf("fakepay: HTTP %d %s: %s", e.StatusCode, e.Type, e.Message)
}

// IsPermanent reports whether err is an answer that retrying will not
// change: a decline (*CardError) or a 4xx *APIError such as bad parameters
// or an idempotency key reused with different parameters. Those are
// outcomes to store. Everything else, server errors and ErrNoResponse in
// particular, is transient: don't store it, retry later with the same key.
func IsPermanent(err error) bool {
	var cardErr *CardError
	if errors.As(err, &cardErr) {
		return true
	}
	var apiErr *APIError
	if errors.As(err, &apiErr) {
		switch apiErr.StatusCode {
		case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooManyRequests:
			return false
		}
		return apiErr.StatusCode >= 400 && apiErr.StatusCode < 500
	}
	return false
}

// Client talks to a Server over HTTP. The zero value with BaseURL set is
// ready to use.
type Client struct {
	// BaseURL is the server's root, e.g. "http://127.0.0.1:5100".
	BaseURL string

	// HTTPClient sends the requests. Defaults to http.DefaultClient, which
	// has no timeout: bound calls with their context.
	HTTPClient *http.Client
}

// CreateCharge asks the server to charge p, deduplicated by
// idempotencyKey.
//
// Always send a key. Without one, a request whose connection drops (see
// Config.DropRate) may have charged, the caller can't know, and a retry
// charges again. With one, the retry returns the original charge. A key
// is only meaningful for one set of parameters: reusing it with other
// parameters gets a 400 idempotency_error.
//
// Errors: *CardError for a decline, *APIError for other HTTP errors, and an
// error wrapping ErrNoResponse when no response arrived, which includes
// the case where the charge was made and the connection dropped before the
// answer. Use IsPermanent to tell an outcome from a reason to retry.
//
// net/http's Transport silently resends a request carrying an
// Idempotency-Key header when a reused keep-alive connection closes before
// the response. That would hide a dropped connection from the caller, the
// very fault this package exists to inject, so CreateCharge opts out and
// leaves retrying to its caller.
func (c *Client) CreateCharge(ctx context.Context, idempotencyKey string, p ChargeParams) (*Charge, error) {
	body, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("fakepay: encoding charge params: %w", err)
	}

	req, err := c.newRequest(ctx, http.MethodPost, "/v1/charges", body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if idempotencyKey != "" {
		req.Header.Set("Idempotency-Key", idempotencyKey)
	}
	// The Transport only resends a request whose body it can rewind, so
	// without GetBody a dropped connection reaches the caller as an error.
	req.GetBody = nil

	var charge Charge
	if err := c.do(req, &charge); err != nil {
		return nil, err
	}
	return &charge, nil
}

// GetCharge returns one charge from the ledger. An unknown id is an
// *APIError with StatusCode 404.
func (c *Client) GetCharge(ctx context.Context, id string) (*Charge, error) {
	req, err := c.newRequest(ctx, http.MethodGet, "/v1/charges/"+url.PathEscape(id), nil)
	if err != nil {
		return nil, err
	}
	var charge Charge
	if err := c.do(req, &charge); err != nil {
		return nil, err
	}
	return &charge, nil
}

// ListCharges returns the server's whole ledger in creation order: the
// source of truth for auditing that each ride was charged exactly once.
func (c *Client) ListCharges(ctx context.Context) ([]Charge, error) {
	req, err := c.newRequest(ctx, http.MethodGet, "/v1/charges", nil)
	if err != nil {
		return nil, err
	}
	var list chargeList
	if err := c.do(req, &list); err != nil {
		return nil, err
	}
	return list.Data, nil
}

func (c *Client) newRequest(ctx context.Context, method, path string, body []byte) (*http.Request, error) {
	if c.BaseURL == "" {
		return nil, errors.New("fakepay: Client.BaseURL is empty")
	}
	var bodyReader io.Reader
	if body != nil {
		bodyReader = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(c.BaseURL, "/")+path, bodyReader)
	if err != nil {
		return nil, fmt.Errorf("fakepay: building %s %s: %w", method, path, err)
	}
	req.Header.Set("Accept", "application/json")
	return req, nil
}

// do sends req and decodes a 2xx body into out, or turns the response into
// the matching error.
func (c *Client) do(req *http.Request, out any) error {
	httpClient := c.HTTPClient
	if httpClient == nil {
		httpClient = http.DefaultClient
	}

	resp, err := httpClient.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %s %s: %w", ErrNoResponse, req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()

	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBodyBytes))
	if err != nil {
		// The status line arrived but the body didn't: the server's answer
		// is as unknown as if nothing had arrived.
		return fmt.Errorf("%w: %s %s: reading response: %w", ErrNoResponse, req.Method, req.URL.Path, err)
	}

	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if err := json.Unmarshal(body, out); err != nil {
			return fmt.Errorf("fakepay: %s %s: decoding HTTP %d response: %w", req.Method, req.URL.Path, resp.StatusCode, err)
		}
		return nil
	}

	var envelope errorBody
	if err := json.Unmarshal(body, &envelope); err != nil || envelope.Error.Type == "" {
		return &APIError{StatusCode: resp.StatusCode, Message: truncate(string(body), 200)}
	}
	detail := envelope.Error
	if resp.StatusCode == http.StatusPaymentRequired && detail.Type == ErrorTypeCard {
		return &CardError{Code: detail.Code, Message: detail.Message}
	}
	return &APIError{
		StatusCode: resp.StatusCode,
		Type:       detail.Type,
		Code:       detail.Code,
		Param:      detail.Param,
		Message:    detail.Message,
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
