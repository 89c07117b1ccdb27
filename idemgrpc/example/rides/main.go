// Command rides is idemgrpc's example: rocket-rides-atomic's ride booking
// as a gRPC service, a fake payment provider with a ledger, and a client
// that retries. See README.md.
//
//	rides pay   [--addr 127.0.0.1:5007] [--latency 0]
//	rides serve [--addr 127.0.0.1:5006] --database-url URL [--payments-url http://127.0.0.1:5007] [--lease 90s]
//	rides book  [--addr 127.0.0.1:5006] [--user EMAIL] [--request-id UUID] [--key-in field|metadata|both|none]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "rides:", err)
		os.Exit(1)
	}
}

const usage = `usage: rides <command> [flags]

  pay    the fake payment provider (keeps a ledger: GET /charges)
  serve  the rides gRPC server
  book   book a ride, retrying, and print every attempt

"rides <command> -h" lists a command's flags.`

func run(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "pay":
		return payCommand(ctx, args[1:], stdout)
	case "serve":
		return serveCommand(ctx, args[1:], stdout)
	case "book":
		return bookCommand(ctx, args[1:], stdout)
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stdout, usage)
		return nil
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}

// payCommand runs the fake payment provider until ctx is done.
func payCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("pay", flag.ContinueOnError)
	addr := fs.String("addr", envOr("PAYMENTS_ADDR", "127.0.0.1:5007"), "address to listen on (env PAYMENTS_ADDR)")
	latency := fs.Duration("latency", 0, "delay before charging: makes a booking slow enough to retry into")
	if err := fs.Parse(args); err != nil {
		return err
	}
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("pay: %w", err)
	}
	srv := &http.Server{Handler: newPayments(*latency), ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stdout, "payments listening on %s\n", lis.Addr())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(shutdown)
	}
}
