// Package ridesapp is the rides service: a Go port of rocket-rides-atomic's
// POST /rides on idem.
//
// A ride request does three things that cannot share a transaction: it
// writes the ride, charges the rider at a payment provider, and queues a
// receipt email. Each is an atomic phase of one idem flow, committed with
// the request's recovery point:
//
//	ride_created      insert the ride and its audit record
//	charge_created    charge 2000 usd with the phase's downstream
//	                  idempotency key; record the charge on the ride
//	receipt_enqueued  queue the receipt (River, in the phase's
//	                  transaction) and respond 201
//
// A declined card ends the flow at charge_created with a stored 402. A
// retry resumes after the last committed phase, and a crash between the
// charge and its commit is harmless: the phase runs again with the same
// downstream key, and the provider returns the charge it already made.
//
// The package holds the schema and its migration ([Migrate], [Seed]), the
// flow and its HTTP handler ([App]), the receipt worker ([ReceiptWorker])
// and the server the serve command runs ([Serve]). The tests port
// rocket-rides-atomic's specs.
package ridesapp
