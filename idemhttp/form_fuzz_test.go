package idemhttp

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

type fuzzCharge struct {
	Amount   int64             `json:"amount"`
	Rate     float64           `json:"rate"`
	Capture  bool              `json:"capture"`
	Items    []struct{ N int } `json:"items"`
	Metadata map[string]string `json:"metadata"`
}

// FuzzFormToJSON decodes arbitrary form bodies. It never panics; what it
// accepts is one valid JSON object, typed or not; and, where no field
// appends to an array ("[]") and nothing is escaped, the order of the
// fields does not change it: the key's fingerprint is taken over it.
func FuzzFormToJSON(f *testing.F) {
	for _, seed := range []string{
		"amount=2000&currency=usd",
		"card[number]=4242&card[exp_month]=12",
		"items[0][price]=p_1&items[1][price]=p_2&items[0][quantity]=3",
		"expand[]=customer&expand[]=invoice",
		"metadata[order_id]=6735&metadata[note]=a+b%26c",
		"amount=1e400&rate=-0.5&capture=true",
		"a=1&a=2",
		"a[b]=1&a=2",
		"a[=1",
		"items[1]=x",
		"a[0][b][]=1&a[0][b][]=2",
		"=&&=x",
		"name=%FF",
		"m[%FF]=1&m[%FE]=2",
		"a0[999]=x&a1[999]=x&a2[999]=x",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		for _, typ := range []reflect.Type{reflect.TypeFor[any](), reflect.TypeFor[fuzzCharge]()} {
			out, err := formToJSON([]byte(body), typ)
			if err != nil {
				require.ErrorIs(t, err, errMalformedForm)
				continue
			}
			require.True(t, json.Valid(out), "%q made %q", body, out)
			require.Equal(t, byte('{'), out[0])
			if strings.Contains(body, "[]") || strings.Contains(body, "%") {
				continue
			}
			pairs := strings.Split(body, "&")
			slices.Reverse(pairs)
			reversed, err := formToJSON([]byte(strings.Join(pairs, "&")), typ)
			require.NoError(t, err, "%q is accepted, in reverse order not", body)
			require.Equal(t, string(out), string(reversed), "%q", body)
		}
	})
}
