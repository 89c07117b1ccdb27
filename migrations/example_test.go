package migrations_test

import (
	"fmt"
	"log"

	"github.com/go-idem/idem/migrations"
)

// Script prints the SQL for a team's own migration tool; it needs no
// database. Here, reverting version 1 in schema billing, in plain SQL.
func ExampleMigrator_Script() {
	m, err := migrations.New(nil, &migrations.Config{Schema: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	down, err := m.Script(migrations.FormatSQL, migrations.DirectionDown, 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(down)
	// Output:
	// -- idem migration 0001_idem_keys (down)
	// BEGIN;
	// DROP TABLE IF EXISTS "billing".idem_keys;
	// DROP TABLE IF EXISTS "billing".idem_migrations;
	// COMMIT;
}
