package idem_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/go-idem/idem"
)

// NewFlow checks a declaration before anything runs; each of these is refused
// with an error that says what to fix.
func ExampleNewFlow_invalid() {
	type order struct {
		SKU string `json:"sku"`
	}
	respond := func(context.Context, pgx.Tx, *idem.Attempt[order]) (idem.Result, error) {
		return idem.RespondJSON(http.StatusCreated, "ok"), nil
	}
	for _, decl := range []struct {
		name   string
		phases []idem.Phase[order]
	}{
		{"orders create", []idem.Phase[order]{{Name: "created", Do: respond}}},
		{"orders.create", []idem.Phase[order]{{Name: "Created", Do: respond}}},
		{"orders.ship", []idem.Phase[order]{{Name: "shipped", Do: respond}, {Name: "shipped", Do: respond}}},
		{"orders.cancel", []idem.Phase[order]{{Name: "cancelled"}}},
		{"orders.notify", []idem.Phase[order]{{Name: "notified", Do: respond, Foreign: idem.ForeignNotIdempotent}}},
	} {
		_, err := idem.NewFlow(decl.name, decl.phases, nil)
		fmt.Println(err)
	}
	// Output:
	// idem: flow name "orders create": use 1-128 letters, digits and _.:/- starting with a letter or digit
	// idem: flow "orders.create" phase 0: name "Created": use lowercase letters, digits and _ starting with a letter, at most 64
	// idem: flow "orders.ship" has two phases named "shipped"
	// idem: flow "orders.cancel" phase "cancelled" has no Do function
	// idem: flow "orders.notify" phase "notified" makes a not-idempotent foreign call and needs a Reconcile hook
}

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
