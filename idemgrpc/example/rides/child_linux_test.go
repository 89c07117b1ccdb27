package main

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the child get SIGKILL when the test binary dies, so a
// crashed test leaves no server behind.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
