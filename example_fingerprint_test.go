package idem_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/go-idem/idem"
)

// Two requests are the same request when their flow and the value of their
// params are: key order, whitespace and the spelling of numbers do not count.
func ExampleFingerprint() {
	a, _ := idem.Fingerprint("orders.create", []byte(`{"sku": "A-1", "amount": 1000}`))
	b, _ := idem.Fingerprint("orders.create", []byte(`{"amount":1.0e3,"sku":"A-1"}`))
	c, _ := idem.Fingerprint("orders.create", []byte(`{"amount":1001,"sku":"A-1"}`))
	d, _ := idem.Fingerprint("orders.quote", []byte(`{"sku": "A-1", "amount": 1000}`))
	fmt.Println("same value, other spelling:", bytes.Equal(a, b))
	fmt.Println("other amount:", bytes.Equal(a, c))
	fmt.Println("other flow:", bytes.Equal(a, d))

	// What is hashed: the flow name, 0x00, and the canonical JSON.
	want := sha256.Sum256([]byte("orders.create\x00" + `{"amount":1000,"sku":"A-1"}`))
	fmt.Println("SHA-256 of name, 0x00, canonical JSON:", bytes.Equal(a, want[:]))

	_, err := idem.Fingerprint("orders.create", []byte(`{"sku":"A-1","sku":"B-2"}`))
	fmt.Println(errors.Is(err, idem.ErrInvalidParams), err)
	// Output:
	// same value, other spelling: true
	// other amount: false
	// other flow: false
	// SHA-256 of name, 0x00, canonical JSON: true
	// true idem: invalid request: params: invalid JSON: duplicate member name "sku" at offset 13
}
