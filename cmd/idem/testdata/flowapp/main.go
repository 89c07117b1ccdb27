// Command flowapp is an application's own idem CLI in miniature: idemcli
// with the application's flows registered, which is what complete and
// reconcile need. The CLI tests build and run it.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/cmd/idem/internal/testflows"
	"github.com/go-idem/idem/idemcli"
)

func main() {
	// The flows' providers write through a pool of their own. pgxpool
	// connects lazily, so `flowapp help` works without a database.
	provider, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "flowapp:", err)
		os.Exit(idemcli.ExitUsage)
	}
	// Main exits the process, which closes the pool.
	idemcli.Main(&idemcli.Config{
		Name:  "flowapp",
		Flows: []idem.AnyFlow{testflows.Orders(provider), testflows.Texts(provider)},
	})
}
