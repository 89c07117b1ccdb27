package idemhttp_test

import (
	"fmt"
	"net/http"

	"github.com/go-idem/idem/idemhttp"
)

// ParseKey takes the header's values as http.Header.Values returns them.
// It accepts the IETF draft's sf-string and the bare key Stripe's clients
// send, and refuses anything ambiguous rather than guess.
func ExampleParseKey() {
	for _, values := range [][]string{
		{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}, // an sf-string (IETF draft)
		{`8e03978e-40d5-43e8-bc93-6894a57f9324`},   // a bare key (Stripe)
		{`"order \"42\"";v=1`},                     // escapes, and a parameter, which is ignored
		{"", " k1 "},                               // empty values and whitespace around the key don't count
		nil,
		{`"k1"`, `"k2"`},
		{`"k1", "k2"`},
		{`"unterminated`},
	} {
		key, err := idemhttp.ParseKey(values)
		if err != nil {
			fmt.Printf("%q: %v\n", values, err)
			continue
		}
		fmt.Printf("%q: key %q\n", values, key)
	}
	// Output:
	// ["\"8e03978e-40d5-43e8-bc93-6894a57f9324\""]: key "8e03978e-40d5-43e8-bc93-6894a57f9324"
	// ["8e03978e-40d5-43e8-bc93-6894a57f9324"]: key "8e03978e-40d5-43e8-bc93-6894a57f9324"
	// ["\"order \\\"42\\\"\";v=1"]: key "order \"42\""
	// ["" " k1 "]: key "k1"
	// []: idemhttp: missing Idempotency-Key header
	// ["\"k1\"" "\"k2\""]: idemhttp: malformed Idempotency-Key header: more than one Idempotency-Key header; send exactly one key
	// ["\"k1\", \"k2\""]: idemhttp: malformed Idempotency-Key header: value is a list of 2 members; send exactly one key
	// ["\"unterminated"]: idemhttp: malformed Idempotency-Key header: unterminated sf-string at position 0
}

// FormatKey writes the header a client sends; ParseKey gives the key back.
func ExampleFormatKey() {
	h := http.Header{}
	h.Set("Idempotency-Key", idemhttp.FormatKey(`order "42"`))
	fmt.Println(h.Get("Idempotency-Key"))

	key, err := idemhttp.ParseKey(h.Values("Idempotency-Key"))
	fmt.Printf("%q %v\n", key, err)
	// Output:
	// "order \"42\""
	// "order \"42\"" <nil>
}
