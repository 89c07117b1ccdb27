package docsnippets

import (
	"context"
	"log/slog"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/examples/orders"
	"github.com/go-idem/idem/idemcli"
	"github.com/go-idem/idem/idemdriver"
)

// maintenance holds docs/operations.md, "What to run".
func maintenance(ctx context.Context, store idemdriver.Store, payments orders.Payments, logger *slog.Logger, otelObserver idem.Observer) error {
	runner, err := idem.NewRunner(store, &idem.Config{
		Flows:    []idem.AnyFlow{orders.NewFlow(payments)},
		Logger:   logger,
		Observer: otelObserver, // optional, see Metrics
		// Maintenance: &idem.MaintainerConfig{...}, // nil: the defaults above
	})
	if err != nil {
		return err
	}
	if err := runner.Start(ctx); err != nil {
		return err
	}
	defer runner.Stop(context.Background()) // before the store closes
	return nil
}

// newPaymentsClient stands for a payment provider's client.
func newPaymentsClient() orders.Payments { return nil }

// main holds docs/operations.md, "The CLI": an application's own CLI, in
// the file named on the next line.
// cmd/ordersctl/main.go
func main() {
	payments := newPaymentsClient() // complete and reconcile run your phases, with their dependencies
	idemcli.Main(&idemcli.Config{Name: "ordersctl", Flows: []idem.AnyFlow{orders.NewFlow(payments)}})
}
