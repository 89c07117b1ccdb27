//go:build unix && !linux

package demo

import (
	"os/exec"
	"syscall"
)

// configureChild puts a serve process in a process group of its own, so a
// Ctrl-C reaches the demo, which stops the servers in order. (Linux also
// gets a parent-death signal; elsewhere a killed demo can leave servers.)
func configureChild(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}
