package pgtest

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// setParentDeathSignal makes the kernel send SIGQUIT (postgres's immediate shutdown) to the child
// when the test binary dies, however it dies, so a killed run does not leak a server.
func setParentDeathSignal(attr *syscall.SysProcAttr) {
	attr.Pdeathsig = syscall.SIGQUIT
}

// isZombie reports whether pid has exited but not been reaped, which happens to an orphaned
// postmaster when the container's init does not reap.
func isZombie(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and may itself contain any byte.
	end := bytes.LastIndexByte(stat, ')')
	return end >= 0 && end+2 < len(stat) && stat[end+2] == 'Z'
}
