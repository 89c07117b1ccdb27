package idem

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/internal/testfixture"
)

// fingerprintOf is a JSON payload's unkeyed fingerprint with no target.
func fingerprintOf(flow string, payload []byte) ([]byte, error) {
	fps, err := fingerprints(nil, flow, "", payload, false)
	if err != nil {
		return nil, err
	}
	return fps[0], nil
}

func TestFingerprint(t *testing.T) {
	t.Parallel()

	t.Run("Layout", func(t *testing.T) {
		t.Parallel()

		// The stored fingerprints depend on this exact layout; changing it
		// makes every key in flight a mismatch.
		got, err := fingerprintOf("rides", []byte(` {"b": 2, "a": 1.0} `))
		require.NoError(t, err)
		want := sha256.Sum256([]byte("rides\x00\x00j{\"a\":1,\"b\":2}"))
		require.Equal(t, append([]byte{2}, want[:]...), got)
		require.Len(t, got, 1+sha256.Size)

		// Keyed, and under several keys at once (a rotation).
		key := bytes.Repeat([]byte{7}, MinFingerprintKeyLength)
		fps, err := fingerprints([][]byte{key, nil}, "rides", "/rides", []byte(`{"a":1}`), false)
		require.NoError(t, err)
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte("rides\x00/rides\x00j{\"a\":1}"))
		require.Equal(t, append([]byte{2}, mac.Sum(nil)...), fps[0])
		plain := sha256.Sum256([]byte("rides\x00/rides\x00j{\"a\":1}"))
		require.Equal(t, append([]byte{2}, plain[:]...), fps[1])
	})

	t.Run("SameValueSameFingerprint", func(t *testing.T) {
		t.Parallel()

		a, err := fingerprintOf("rides", []byte(`{"origin_lat":37.7749,"origin_lon":-122.4194}`))
		require.NoError(t, err)
		b, err := fingerprintOf("rides", []byte("{\n  \"origin_lon\": -122.41940,\n  \"origin_lat\": 3.77749e1\n}"))
		require.NoError(t, err)
		require.Equal(t, a, b)
	})

	t.Run("DifferentValueOrFlow", func(t *testing.T) {
		t.Parallel()

		base, err := fingerprintOf("rides", []byte(`{"amount":12345678901234567890}`))
		require.NoError(t, err)

		for _, tt := range []struct {
			flow   string
			params string
		}{
			{"rides", `{"amount":12345678901234567000}`}, // equal as doubles, not as money
			{"rides", `{"amount":"12345678901234567890"}`},
			{"rides", `{"Amount":12345678901234567890}`},
			{"rides", `[{"amount":12345678901234567890}]`},
			{"rides2", `{"amount":12345678901234567890}`},
			{"", `{"amount":12345678901234567890}`},
		} {
			got, err := fingerprintOf(tt.flow, []byte(tt.params))
			require.NoError(t, err)
			require.NotEqual(t, base, got, "%s %s", tt.flow, tt.params)
		}
	})

	t.Run("SeparatorKeepsFlowAndParamsApart", func(t *testing.T) {
		t.Parallel()

		// Without the separator, flow "a1" with params 2 and flow "a" with
		// params 12 would hash the same bytes.
		a, err := fingerprintOf("a1", []byte(`2`))
		require.NoError(t, err)
		b, err := fingerprintOf("a", []byte(`12`))
		require.NoError(t, err)
		require.NotEqual(t, a, b)
	})

	t.Run("ResultIsNotShared", func(t *testing.T) {
		t.Parallel()

		a, err := fingerprintOf("rides", []byte(`1`))
		require.NoError(t, err)
		aCopy := append([]byte(nil), a...)
		_, err = fingerprintOf("rides", []byte(`2`))
		require.NoError(t, err)
		require.Equal(t, aCopy, a)
	})

	t.Run("InvalidParams", func(t *testing.T) {
		t.Parallel()

		got, err := fingerprintOf("rides", []byte(`{"a":1,"A":2}`))
		require.ErrorIs(t, err, ErrInvalidParams)
		require.Nil(t, got)

		_, err = fingerprintOf("rides", nil)
		require.ErrorIs(t, err, ErrInvalidParams)
	})
}

func BenchmarkFingerprint(b *testing.B) {
	testfixture.BenchmarkParams(b, func(params []byte) error {
		_, err := fingerprintOf("rides", params)
		return err
	})
}
