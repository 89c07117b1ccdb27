// Package docsnippets holds the Go blocks of docs/ that need a made-up
// application around them, so that they compile: each function here
// contains one or more blocks verbatim, and the repository's
// TestDocCodeBlocksAreCompiled (docs_test.go at its root) fails when a
// block of the documentation is held by no Go file. The functions are never
// called.
package docsnippets
