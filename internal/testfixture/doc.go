// Package testfixture holds the test doubles and inputs that more than one of
// idem's test packages uses, so each exists once: a counter of phase runs, an
// idempotent fake payment provider, the request bodies the canonical JSON
// and fingerprint benchmarks share, a buffer goroutines may share, and a
// pause that holds the code under test at one point until the test lets it go.
//
// It is for tests only; nothing outside _test.go files imports it.
package testfixture
