//go:build !linux

package main

import "os/exec"

// dieWithParent is Linux's parent-death signal; elsewhere the test's
// cleanup kills the child.
func dieWithParent(*exec.Cmd) {}
