package idem_test

import "testing"

// The release before 0008 keeps acquiring on one connection across
// migration 0008 and back: idem_acquire_v7 (what it calls, called here as it
// does) reads the lease row into a variable of the table's row type, whose
// columns 0008 adds and its down drops, and a session that compiled it
// before must not fail its next call.
func TestAcquireV7OnOneConnectionAcrossMigration0008(t *testing.T) {
	t.Parallel()
	acquireOnOneSessionAcross(t, 8, `idem_acquire_v7(NULL, 's', $1, 'f', 'POST', '/', '\x01', '{}', 60000000, false, '')`, nil)
}
