package pgtest

import (
	"bytes"
	"os"
	"path/filepath"
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

// childPIDs lists the processes whose parent is pid, from /proc.
func childPIDs(pid int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var children []int
	for _, path := range stats {
		stat, err := os.ReadFile(path)
		if err != nil {
			continue // gone meanwhile
		}
		// "pid (comm) state ppid ...", where comm may contain anything, parentheses included.
		end := bytes.LastIndexByte(stat, ')')
		if end < 0 {
			continue
		}
		fields := bytes.Fields(stat[end+1:])
		if len(fields) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(string(fields[1])); err != nil || ppid != pid {
			continue
		}
		if child, err := strconv.Atoi(filepath.Base(filepath.Dir(path))); err == nil {
			children = append(children, child)
		}
	}
	return children
}

// removeSysVSegment removes the System V shared memory segment with this id. A postmaster that exits
// removes its own; one killed with SIGKILL leaves it behind, and, its data directory being gone,
// no later postmaster will.
func removeSysVSegment(id int) error {
	const ipcRMID = 0
	if _, _, errno := syscall.Syscall(syscall.SYS_SHMCTL, uintptr(id), ipcRMID, 0); errno != 0 {
		return errno
	}
	return nil
}
