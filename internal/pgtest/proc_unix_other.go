//go:build unix && !linux

package pgtest

import "syscall"

// setParentDeathSignal does nothing: only Linux has a parent-death signal. Elsewhere a server whose
// test binary is killed runs until stopped by hand, though its directory is still cleaned up once
// it has stopped.
func setParentDeathSignal(*syscall.SysProcAttr) {}

func isZombie(int) bool { return false }

// childPIDs lists nothing: there is no /proc to read. A killed postmaster's children notice its
// death and exit on their own.
func childPIDs(int) []int { return nil }

// removeSysVSegment does nothing: a killed postmaster's segment is left for ipcrm.
func removeSysVSegment(int) error { return nil }
