package idem_test

import (
	"context"
	"fmt"
	"net/http"

	"github.com/go-idem/idem"
)

// NewFlow checks a declaration before anything runs; each of these is refused
// with an error that says what to fix.
func ExampleNewFlow_invalid() {
	type order struct {
		SKU string `json:"sku"`
	}
	respond := func(context.Context, idem.Tx, *idem.Attempt[order]) (idem.Result, error) {
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
