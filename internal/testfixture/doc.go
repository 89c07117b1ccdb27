// Package testfixture holds the test doubles and inputs that more than one of
// idem's test packages uses, so each exists once: a counter of phase runs, an
// idempotent fake payment provider, and the request bodies the canonical JSON
// and fingerprint benchmarks share, and a buffer goroutines may share.
//
// It is for tests only; nothing outside _test.go files imports it.
package testfixture
