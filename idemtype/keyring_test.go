package idemtype_test

import (
	"bytes"
	"testing"

	"github.com/go-idem/idem/idemtype"
	"github.com/stretchr/testify/require"
)

func TestKeyringCheck(t *testing.T) {
	t.Parallel()
	key := bytes.Repeat([]byte{1}, 32)
	long := bytes.Repeat([]byte{1}, 48)
	require.NoError(t, (&idemtype.Keyring{Current: "k1", Keys: map[string][]byte{"k1": key}}).Check(32, 32))
	require.NoError(t, (&idemtype.Keyring{Current: "k1", Keys: map[string][]byte{"k1": long}}).Check(32, 0))
	for name, c := range map[string]struct {
		k              idemtype.Keyring
		minLen, maxLen int
		want           string
	}{
		"no current":      {idemtype.Keyring{Keys: map[string][]byte{"k1": key}}, 32, 32, `current key "" is not in Keys`},
		"unknown current": {idemtype.Keyring{Current: "k2", Keys: map[string][]byte{"k1": key}}, 32, 32, `current key "k2"`},
		"exact length":    {idemtype.Keyring{Current: "k1", Keys: map[string][]byte{"k1": long}}, 32, 32, "it takes 32"},
		"short":           {idemtype.Keyring{Current: "k1", Keys: map[string][]byte{"k1": key[:16]}}, 32, 0, "under 32"},
		"bad id":          {idemtype.Keyring{Current: "k 1", Keys: map[string][]byte{"k 1": key}}, 32, 32, "letters, digits"},
	} {
		require.ErrorContains(t, c.k.Check(c.minLen, c.maxLen), c.want, name)
	}
}

// IDs puts Current first and the others in one order, so that every
// request tries the fingerprint keys in the same order.
func TestKeyringIDs(t *testing.T) {
	t.Parallel()
	k := &idemtype.Keyring{Current: "b", Keys: map[string][]byte{"c": nil, "a": nil, "b": nil}}
	require.Equal(t, []string{"b", "a", "c"}, k.IDs())
}
