package idem_test

import (
	"crypto/sha256"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/internal/testfixture"
)

func TestFingerprint(t *testing.T) {
	t.Parallel()

	t.Run("Layout", func(t *testing.T) {
		t.Parallel()

		// The stored fingerprints depend on this exact layout; changing it
		// makes every key in flight a mismatch.
		got, err := idem.Fingerprint("rides", []byte(` {"b": 2, "a": 1.0} `))
		require.NoError(t, err)
		want := sha256.Sum256([]byte("rides\x00{\"a\":1,\"b\":2}"))
		require.Equal(t, want[:], got)
		require.Len(t, got, sha256.Size)
	})

	t.Run("SameValueSameFingerprint", func(t *testing.T) {
		t.Parallel()

		a, err := idem.Fingerprint("rides", []byte(`{"origin_lat":37.7749,"origin_lon":-122.4194}`))
		require.NoError(t, err)
		b, err := idem.Fingerprint("rides", []byte("{\n  \"origin_lon\": -122.41940,\n  \"origin_lat\": 3.77749e1\n}"))
		require.NoError(t, err)
		require.Equal(t, a, b)
	})

	t.Run("DifferentValueOrFlow", func(t *testing.T) {
		t.Parallel()

		base, err := idem.Fingerprint("rides", []byte(`{"amount":12345678901234567890}`))
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
			got, err := idem.Fingerprint(tt.flow, []byte(tt.params))
			require.NoError(t, err)
			require.NotEqual(t, base, got, "%s %s", tt.flow, tt.params)
		}
	})

	t.Run("SeparatorKeepsFlowAndParamsApart", func(t *testing.T) {
		t.Parallel()

		// Without the separator, flow "a1" with params 2 and flow "a" with
		// params 12 would hash the same bytes.
		a, err := idem.Fingerprint("a1", []byte(`2`))
		require.NoError(t, err)
		b, err := idem.Fingerprint("a", []byte(`12`))
		require.NoError(t, err)
		require.NotEqual(t, a, b)
	})

	t.Run("ResultIsNotShared", func(t *testing.T) {
		t.Parallel()

		a, err := idem.Fingerprint("rides", []byte(`1`))
		require.NoError(t, err)
		aCopy := append([]byte(nil), a...)
		_, err = idem.Fingerprint("rides", []byte(`2`))
		require.NoError(t, err)
		require.Equal(t, aCopy, a)
	})

	t.Run("InvalidParams", func(t *testing.T) {
		t.Parallel()

		got, err := idem.Fingerprint("rides", []byte(`{"a":1,"a":2}`))
		require.ErrorIs(t, err, idem.ErrInvalidParams)
		require.ErrorContains(t, err, "duplicate member name")
		require.Nil(t, got)

		_, err = idem.Fingerprint("rides", nil)
		require.ErrorIs(t, err, idem.ErrInvalidParams)
	})
}

func BenchmarkFingerprint(b *testing.B) {
	testfixture.BenchmarkParams(b, func(params []byte) error {
		_, err := idem.Fingerprint("rides", params)
		return err
	})
}
