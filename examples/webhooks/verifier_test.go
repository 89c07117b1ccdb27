package main

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The Verifier accepts a Stripe-Signature with any number of v1
// signatures, one of which is by one of its secrets (Stripe sends one per
// active secret while a secret is rolled), with a timestamp within the
// tolerance; it refuses the rest, whatever the header's shape.
func TestVerifier(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{"id": "evt_v", "type": "payment_intent.succeeded"}`)
	ts := strconv.FormatInt(now.Unix(), 10)
	v1 := func(secret string, at time.Time) string {
		_, sig, ok := strings.Cut(Sign(secret, at, body), ",v1=")
		require.True(t, ok)
		return sig
	}
	zeros := strings.Repeat("00", 32)
	for _, tc := range []struct {
		name    string
		secrets []string
		header  string
		err     string // empty: accepted
	}{
		{"one secret", []string{"new"}, Sign("new", now, body), ""},
		{"two v1, the second good", []string{"new"}, "t=" + ts + ",v1=" + zeros + ",v1=" + v1("new", now), ""},
		{"two v1, the first good", []string{"new"}, "t=" + ts + ",v1=" + v1("new", now) + ",v1=" + zeros, ""},
		{"two v1, one per secret", []string{"old", "new"}, "t=" + ts + ",v1=" + v1("old", now) + ",v1=" + v1("new", now), ""},
		{"rolling: signed with the new secret", []string{"old", "new"}, Sign("new", now, body), ""},
		{"rolling: signed with the old secret", []string{"old", "new"}, Sign("old", now, body), ""},
		{"rolled: the old secret is gone", []string{"new"}, Sign("old", now, body), "no signature matches"},
		{"v0 and spaces", []string{"new"}, "t=" + ts + ", v0=abc, v1=" + v1("new", now), ""},
		{"another secret", []string{"new"}, Sign("attacker", now, body), "no signature matches"},
		{"two v1, none good", []string{"new"}, "t=" + ts + ",v1=" + zeros + ",v1=" + v1("attacker", now), "no signature matches"},
		{"garbage v1 (not hex)", []string{"new"}, "t=" + ts + ",v1=zz", "no v1 signature"},
		{"truncated v1", []string{"new"}, "t=" + ts + ",v1=" + v1("new", now)[:32], "no signature matches"},
		{"no v1", []string{"new"}, "t=" + ts, "no v1 signature"},
		{"no timestamp", []string{"new"}, "v1=" + v1("new", now), "no timestamp"},
		{"a timestamp other than the signed one", []string{"new"}, "t=+" + ts + ",v1=" + v1("new", now), "no signature matches"},
		{"4 minutes ahead", []string{"new"}, Sign("new", now.Add(4*time.Minute), body), ""},
		{"6 minutes ahead", []string{"new"}, Sign("new", now.Add(6*time.Minute), body), "outside the tolerance"},
		{"6 minutes old", []string{"new"}, Sign("new", now.Add(-6*time.Minute), body), "outside the tolerance"},
		{"no header", []string{"new"}, "", "no Stripe-Signature header"},
	} {
		v := &Verifier{Secrets: tc.secrets, Now: func() time.Time { return now }}
		r := httptest.NewRequest(http.MethodPost, "/webhooks/stripe", nil)
		if tc.header != "" {
			r.Header.Set(SignatureHeader, tc.header)
		}
		err := v.Verify(r, body)
		if tc.err == "" {
			require.NoError(t, err, tc.name)
		} else {
			require.ErrorContains(t, err, tc.err, tc.name)
		}
	}
}
