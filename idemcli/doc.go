// Package idemcli is the idem command-line tool as a library: migrations,
// key inspection, forced unlocks, operators' verdicts on needs_reconcile
// keys (keys resolve), and on-demand reaper, completer and reconcile runs
// against the database in DATABASE_URL.
//
// The generic binary, cmd/idem, knows no flows, so it can migrate, list,
// show, unlock, resolve (every verdict but resuming after a phase that
// happened, which must know the flow) and reap, but not complete or reconcile: those run the
// application's own phases and reconcile hooks. An application that wants
// them builds its own binary with its flows registered:
//
//	// cmd/ordersctl/main.go
//	func main() {
//		payments := newPaymentsClient() // complete and reconcile run your phases, with their dependencies
//		idemcli.Main(&idemcli.Config{Name: "ordersctl", Flows: []idem.AnyFlow{orders.NewFlow(payments)}})
//	}
//
// and runs `ordersctl complete` or `ordersctl reconcile` like any other
// command. Every command prints a human table by default and JSON with
// --json, logs to stderr, and exits with one of the documented codes
// ([ExitOK], [ExitFailure], [ExitUsage], [ExitNotFound], [ExitNoFlows]).
// `idem help` lists the commands; `idem help COMMAND` shows a command's
// flags and examples.
package idemcli
