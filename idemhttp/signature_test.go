package idemhttp_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemhttp"
)

func hmacHex(secret, payload string) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(payload))
	return hex.EncodeToString(mac.Sum(nil))
}

const (
	secretOld = "whsec_0123456789abcdef0123"
	secretNew = "whsec_fedcba9876543210fedc"
)

// Secrets a delivery could be forged under are refused when the verifier
// is built: none, empty, blank (what "whsec_a," split on commas gives),
// padded, or short.
func TestSignaturePresetsRefuseWeakSecrets(t *testing.T) {
	t.Parallel()
	for name, secrets := range map[string][]string{
		"none":   nil,
		"empty":  {secretOld, ""},
		"blank":  {"  "},
		"padded": {" " + secretOld},
		"short":  {"whsec_short"},
	} {
		_, err := idemhttp.StripeSignature(secrets, 0)
		require.Error(t, err, name)
		_, err = idemhttp.GitHubSignature(secrets)
		require.Error(t, err, name)
	}
	_, err := idemhttp.StripeSignature([]string{secretOld}, -time.Second)
	require.ErrorContains(t, err, "negative")
}

// Stripe: t= and v1=, every configured secret accepted (rotation), every
// v1 in the header tried, the timestamp within the tolerance either way.
func TestStripeSignature(t *testing.T) {
	t.Parallel()
	verify, err := idemhttp.StripeSignature([]string{secretOld, secretNew}, time.Minute)
	require.NoError(t, err)
	body := `{"id":"evt_1"}`
	signed := func(ts time.Time, secrets ...string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/webhooks/stripe", strings.NewReader(body))
		parts := []string{fmt.Sprintf("t=%d", ts.Unix())}
		for _, s := range secrets {
			parts = append(parts, "v1="+hmacHex(s, fmt.Sprintf("%d.%s", ts.Unix(), body)))
		}
		r.Header.Set("Stripe-Signature", strings.Join(parts, ","))
		return r
	}
	now := time.Now()
	require.NoError(t, verify(signed(now, secretOld), []byte(body)))
	require.NoError(t, verify(signed(now, secretNew), []byte(body)))
	require.NoError(t, verify(signed(now, "whsec_unknown_unknown_unknown", secretNew), []byte(body)), "any v1 may match")
	for name, r := range map[string]*http.Request{
		"other secret": signed(now, "whsec_unknown_unknown_unknown"),
		"too old":      signed(now.Add(-2*time.Minute), secretOld),
		"too new":      signed(now.Add(2*time.Minute), secretOld),
		"no signature": httptest.NewRequest(http.MethodPost, "/", nil),
		"no v1":        func() *http.Request { r := signed(now); return r }(),
		"bad timestamp": func() *http.Request {
			r := signed(now, secretOld)
			r.Header.Set("Stripe-Signature", "t=x,v1=00")
			return r
		}(),
	} {
		require.ErrorIs(t, verify(r, []byte(body)), idemhttp.ErrSignature, name)
	}
	require.ErrorIs(t, verify(signed(now, secretOld), []byte(`{"id":"evt_2"}`)), idemhttp.ErrSignature, "another body")
}

// GitHub: sha256= over the body, every configured secret accepted.
func TestGitHubSignature(t *testing.T) {
	t.Parallel()
	verify, err := idemhttp.GitHubSignature([]string{secretOld, secretNew})
	require.NoError(t, err)
	body := `{"action":"opened"}`
	signed := func(value string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/webhooks/github", strings.NewReader(body))
		r.Header.Set("X-Hub-Signature-256", value)
		return r
	}
	require.NoError(t, verify(signed("sha256="+hmacHex(secretOld, body)), []byte(body)))
	require.NoError(t, verify(signed("sha256="+hmacHex(secretNew, body)), []byte(body)))
	for name, value := range map[string]string{
		"other secret": "sha256=" + hmacHex("whsec_unknown_unknown_unknown", body),
		"no prefix":    hmacHex(secretOld, body),
		"not hex":      "sha256=zz",
		"sha1":         "sha1=" + hmacHex(secretOld, body)[:40],
		"missing":      "",
	} {
		require.ErrorIs(t, verify(signed(value), []byte(body)), idemhttp.ErrSignature, name)
	}
}
