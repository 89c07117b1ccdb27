package demo

import (
	"os/exec"
	"syscall"
)

// configureChild puts a serve process in a process group of its own, so a
// Ctrl-C reaches the demo, which stops the servers in order, rather than
// everything at once; and has the kernel kill it if the demo dies, however
// it dies, so no server outlives the run.
func configureChild(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
