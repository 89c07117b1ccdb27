package idemhttp

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Presets of WebhookConfig.Verify for common providers.
const (
	// MinSecretLength is the shortest webhook secret the presets accept.
	// Stripe's are about 38 characters; a short one can be guessed.
	MinSecretLength = 16
	// StripeToleranceDefault is the default tolerance of StripeSignature:
	// the 5 minutes of Stripe's own libraries.
	StripeToleranceDefault = 5 * time.Minute
)

// ErrSignature is what a preset verifier's errors wrap: the delivery's
// signature is missing, malformed, does not match the body under any
// secret, or its timestamp is outside the tolerance.
var ErrSignature = errors.New("idemhttp: webhook signature refused")

// checkSecrets refuses a list of secrets a delivery could be forged under:
// none, an empty or blank one (an environment variable "whsec_a," split on
// commas gives one, and a MAC under an empty key is anyone's to compute),
// or one shorter than MinSecretLength.
func checkSecrets(provider string, secrets []string) ([][]byte, error) {
	if len(secrets) == 0 {
		return nil, fmt.Errorf("idemhttp: %s webhook verifier needs at least one secret", provider)
	}
	keys := make([][]byte, 0, len(secrets))
	for i, s := range secrets {
		switch {
		case strings.TrimSpace(s) == "":
			return nil, fmt.Errorf("idemhttp: %s webhook secret %d of %d is empty or blank: anyone could sign with it", provider, i+1, len(secrets))
		case s != strings.TrimSpace(s):
			return nil, fmt.Errorf("idemhttp: %s webhook secret %d of %d has white space around it", provider, i+1, len(secrets))
		case len(s) < MinSecretLength:
			return nil, fmt.Errorf("idemhttp: %s webhook secret %d of %d is %d characters long, shorter than %d", provider, i+1, len(secrets), len(s), MinSecretLength)
		}
		keys = append(keys, []byte(s))
	}
	return keys, nil
}

// matches reports whether sig is the HMAC-SHA256 of payload under one of
// keys, comparing in constant time; every key is tried, so the time taken
// does not say which one matched.
func matches(keys [][]byte, payload, sig []byte) bool {
	ok := false
	for _, key := range keys {
		mac := hmac.New(sha256.New, key)
		mac.Write(payload)
		if hmac.Equal(mac.Sum(nil), sig) {
			ok = true
		}
	}
	return ok
}

// StripeSignature returns a WebhookConfig.Verify for Stripe: the
// Stripe-Signature header's t= timestamp and v1= signatures, HMAC-SHA256
// of "t.body" under a secret (whsec_…). Every secret in secrets is
// accepted, so a rolled secret can be added before the old one is removed
// (Stripe then sends a v1 signature for each). A timestamp further than
// tolerance from now is refused, so a captured delivery cannot be sent
// again later; zero tolerance is StripeToleranceDefault. An empty, blank
// or short secret (MinSecretLength) is refused here, when the verifier is
// built, never at the first delivery.
func StripeSignature(secrets []string, tolerance time.Duration) (func(*http.Request, []byte) error, error) {
	keys, err := checkSecrets("Stripe", secrets)
	if err != nil {
		return nil, err
	}
	if tolerance < 0 {
		return nil, fmt.Errorf("idemhttp: Stripe webhook tolerance %s is negative", tolerance)
	}
	if tolerance == 0 {
		tolerance = StripeToleranceDefault
	}
	return func(r *http.Request, body []byte) error {
		header := r.Header.Get("Stripe-Signature")
		if header == "" {
			return fmt.Errorf("%w: no Stripe-Signature header", ErrSignature)
		}
		var ts string
		var sigs [][]byte
		for part := range strings.SplitSeq(header, ",") {
			name, value, _ := strings.Cut(strings.TrimSpace(part), "=")
			switch name {
			case "t":
				ts = value
			case "v1":
				if sig, err := hex.DecodeString(value); err == nil && len(sig) == sha256.Size {
					sigs = append(sigs, sig)
				}
			}
		}
		secs, err := strconv.ParseInt(ts, 10, 64)
		if err != nil {
			return fmt.Errorf("%w: Stripe-Signature has no valid timestamp", ErrSignature)
		}
		if len(sigs) == 0 {
			return fmt.Errorf("%w: Stripe-Signature has no v1 signature", ErrSignature)
		}
		if age := time.Since(time.Unix(secs, 0)); age > tolerance || age < -tolerance {
			return fmt.Errorf("%w: Stripe-Signature timestamp is %s from now, more than the tolerance of %s",
				ErrSignature, age.Round(time.Second), tolerance)
		}
		payload := make([]byte, 0, len(ts)+1+len(body))
		payload = append(append(append(payload, ts...), '.'), body...)
		matched := false
		for _, sig := range sigs {
			if matches(keys, payload, sig) {
				matched = true
			}
		}
		if !matched {
			return fmt.Errorf("%w: no v1 signature of Stripe-Signature matches the body under the configured secrets", ErrSignature)
		}
		return nil
	}, nil
}

// GitHubSignature returns a WebhookConfig.Verify for GitHub: the
// X-Hub-Signature-256 header, "sha256=" and the HMAC-SHA256 of the body
// under a secret. Every secret in secrets is accepted, for rotation. GitHub
// signs neither a timestamp nor the delivery id: read docs/webhooks.md,
// "Trust only what the signature covers", before choosing the EventID. An
// empty, blank or short secret (MinSecretLength) is refused here.
func GitHubSignature(secrets []string) (func(*http.Request, []byte) error, error) {
	keys, err := checkSecrets("GitHub", secrets)
	if err != nil {
		return nil, err
	}
	return func(r *http.Request, body []byte) error {
		value, ok := strings.CutPrefix(r.Header.Get("X-Hub-Signature-256"), "sha256=")
		if !ok {
			return fmt.Errorf("%w: no X-Hub-Signature-256 header of the form sha256=<hex>", ErrSignature)
		}
		sig, err := hex.DecodeString(value)
		if err != nil || len(sig) != sha256.Size {
			return fmt.Errorf("%w: X-Hub-Signature-256 is not a SHA-256 HMAC in hex", ErrSignature)
		}
		if !matches(keys, body, sig) {
			return fmt.Errorf("%w: X-Hub-Signature-256 does not match the body under the configured secrets", ErrSignature)
		}
		return nil
	}, nil
}
