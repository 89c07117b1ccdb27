package idemhttp

import (
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// slotBomb is a 64 KB form of short fields that each index 999: before
// the bound each made a 1000-slot array (16 KB), 180 MB in all.
func slotBomb() []byte {
	var b strings.Builder
	for i := 0; b.Len() < 64<<10; i++ {
		fmt.Fprintf(&b, "a%d[999]=x&", i)
	}
	return []byte(b.String())
}

// A form whose arrays would hold more slots than the body has bytes has
// gaps (a gapless form fills each slot from a field of its own): it is
// refused as the slots are made, before they cost memory in proportion to
// the indexes rather than to the body.
//
// Not parallel: TotalAlloc counts every goroutine's allocations, so the
// test runs while no other test of the package does.
func TestFormArraySlotsBounded(t *testing.T) {
	body := slotBomb()
	_, err := formToJSON(body, reflect.TypeFor[any]())
	require.ErrorIs(t, err, errMalformedForm)

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 3 {
		_, _ = formToJSON(body, reflect.TypeFor[any]())
	}
	runtime.ReadMemStats(&after)
	require.Less(t, (after.TotalAlloc-before.TotalAlloc)/3, uint64(10<<20), "bytes allocated per decode of a 64 KB body")

	// Nested and out-of-order gapless arrays are within the bound.
	out, err := formToJSON([]byte("a[1][1]=d&a[1][0]=c&a[0][1]=b&a[0][0]=a"), reflect.TypeFor[any]())
	require.NoError(t, err)
	require.JSONEq(t, `{"a": [["a", "b"], ["c", "d"]]}`, string(out))
}

// A field name or value that is not UTF-8 once unescaped is refused: JSON
// would replace its bytes with U+FFFD, so that %FF and %FE made the same
// fingerprint, and two such names one duplicate JSON member.
func TestFormRefusesInvalidUTF8(t *testing.T) {
	t.Parallel()
	for _, body := range []string{"name=%FF", "name=%FE", "m[%FF]=1&m[%FE]=2", "%C3=1", "n%FF=a"} {
		_, err := formToJSON([]byte(body), reflect.TypeFor[any]())
		require.ErrorIs(t, err, errMalformedForm, body)
	}
	out, err := formToJSON([]byte("name=%C3%A9"), reflect.TypeFor[any]())
	require.NoError(t, err)
	require.JSONEq(t, `{"name": "é"}`, string(out))
}
