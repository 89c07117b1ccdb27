// Command rides is idem's example service: a Go port of Brandur Leach's
// rocket-rides-atomic, with a fake payment provider, a fault-injecting
// simulator and a one-command demo. See README.md.
//
//	go run ./examples/rides demo        # everything, with nothing set up
//	go run ./examples/rides serve       # the rides API
//	go run ./examples/rides fakepay     # the fake payment provider
//	go run ./examples/rides simulate    # clients and an audit against a running serve
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

const usage = `rides: idem's example service, a Go port of rocket-rides-atomic.

Usage:
  rides <command> [flags]

Commands:
  demo      run everything with nothing set up: a throwaway Postgres, fakepay
            with faults, serve processes (killed now and then with
            --kill-every) and the simulator, then print the audit's summary
  serve     the rides API (POST /rides)
  fakepay   the fake payment provider
  simulate  drive a running serve with faulty clients, then audit it

Run "rides <command> -h" for a command's flags. Every flag with an
environment variable in its help falls back to that variable.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches a command and returns the process's exit status: 0 on
// success, 1 when a simulation finds a violated invariant or a command
// fails, 2 for bad usage, 130 when interrupted.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	commands := map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) error{
		"demo":     demoCommand,
		"serve":    serveCommand,
		"fakepay":  fakepayCommand,
		"simulate": simulateCommand,
	}
	name := args[0]
	if name == "help" || name == "-h" || name == "--help" {
		fmt.Fprint(stdout, usage)
		return 0
	}
	command, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "rides: unknown command %q\n\n%s", name, usage)
		return 2
	}

	// The first Ctrl-C (or SIGTERM) cancels ctx and the command cleans up;
	// after that the signal's default action is restored, so a second
	// Ctrl-C ends the process at once.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop()
	}()

	err := command(ctx, args[1:], stdout, stderr)
	var exit exitError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &exit):
		return int(exit)
	case errors.Is(err, errUsage):
		return 2
	case ctx.Err() != nil:
		fmt.Fprintf(stderr, "rides %s: interrupted\n", name)
		return 130
	}
	fmt.Fprintf(stderr, "rides %s: %v\n", name, err)
	return 1
}

// exitError ends a command with a status and no further message.
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// errUsage is returned for bad flags; the flag package has printed why.
var errUsage = errors.New("usage")
