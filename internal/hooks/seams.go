package hooks

// What idemtest and idem's own tests read of a flow and a store that their
// packages do not export. Package idem and package pgstore install these in
// their init; they are nil until the package is linked in.
var (
	// CurrentName is idem.Flow's: the name of the phase that name names, as
	// its name or one of its Phase.FormerNames; false when no phase of the
	// flow has it. flow is an idem.AnyFlow.
	CurrentName func(flow any, name string) (string, bool)

	// StoreTable is a *pgstore.Store's keys table (possibly
	// schema-qualified); false for another store.
	StoreTable func(store any) (string, bool)

	// StoreWaits is what a *pgstore.Store's key watcher has done.
	StoreWaits func(store any) Waits

	// StoreChannel is the notification channel pgstore LISTENs on for the
	// keys in schema.
	StoreChannel func(schema string) string
)

// Waits is what a pgstore.Store's key watcher has done.
type Waits struct {
	// Notifications counts the wake-ups its listener has received.
	Notifications int64
	// Listening: its listener LISTENs now; false, its watches poll.
	Listening bool
	// Polling: it polls for good, having no way to listen here.
	Polling bool
}
