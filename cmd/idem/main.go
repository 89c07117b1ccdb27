// Command idem is the operator's tool for idem's keys table: it applies and
// prints migrations, lists and shows keys by state, force-unlocks a stuck
// key, resolves a needs_reconcile key by an operator's verdict (keys
// resolve), and runs the reaper on demand. It reads the database from
// DATABASE_URL; `idem help` lists the commands and their exit codes.
//
// This binary knows no application flows, so `idem complete` and
// `idem reconcile` exit with code 4: completing a request or reconciling a
// key runs the application's own phases and reconcile hooks. Build your
// application's CLI with the idemcli package and your flows to get them.
package main

import "github.com/go-idem/idem/idemcli"

func main() { idemcli.Main(nil) }
