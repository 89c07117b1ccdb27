package testfixture

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// RidesParams is a small request body shaped like the rides example's.
var RidesParams = []byte(`{"origin_lat":37.7749,"origin_lon":-122.4194,"target_lat":37.3382,"target_lon":-121.8863}`)

// NestedParams returns a deterministic ~4 KiB document with nested objects
// in unsorted order, escapes, whitespace and numbers to normalise.
func NestedParams(tb testing.TB) []byte {
	tb.Helper()

	var b strings.Builder
	b.WriteString(`{"request": {"user": {"name": "Ad\u00e9la\u00efde", "email": "ada@example.com", "id": 1.0e3},` + "\n")
	b.WriteString(`  "items": [`)
	for i := range 30 {
		if i > 0 {
			b.WriteString(",\n    ")
		}
		fmt.Fprintf(&b, `{"sku": "SKU-%04d", "qty": %d, "price": %d.%02d0, "tags": ["a\/b", "\u2603", "x%d"], `+
			`"meta": {"z": null, "y": true, "x": %de-2}}`, i, i%5+1, 10+i, i, i, i*125)
	}
	b.WriteString("],\n")
	b.WriteString(`  "currency": "USD", "amount": 1234567890123456789.00, "note": "line1\nline2\t\"quoted\""}, "version": 2}`)
	doc := b.String()
	require.InDelta(tb, 4096, len(doc), 512)
	return []byte(doc)
}

// BenchmarkParams benchmarks fn over RidesParams and NestedParams, as the
// sub-benchmarks Rides and Nested4KiB, reporting bytes per second and
// allocations.
func BenchmarkParams(b *testing.B, fn func(params []byte) error) {
	b.Helper()
	for _, bench := range []struct {
		name   string
		params []byte
	}{
		{"Rides", RidesParams},
		{"Nested4KiB", NestedParams(b)},
	} {
		b.Run(bench.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bench.params)))
			for b.Loop() {
				if err := fn(bench.params); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
