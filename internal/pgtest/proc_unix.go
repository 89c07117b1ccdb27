//go:build unix

package pgtest

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"syscall"
)

const localSupported = true

// configureChild runs cmd in a process group of its own, so a Ctrl-C meant for the test binary
// does not reach postgres before Close does, as account when one is given, and, where the
// platform can, with a parent-death signal.
func configureChild(cmd *exec.Cmd, account *runAs) {
	attr := &syscall.SysProcAttr{Setpgid: true}
	if account != nil {
		// Groups left empty: the child gets no supplementary groups, root's least of all.
		attr.Credential = &syscall.Credential{Uid: uint32(account.uid), Gid: uint32(account.gid)}
	}
	setParentDeathSignal(attr)
	cmd.SysProcAttr = attr
}

// processAlive reports whether pid is a live process. A process we may not signal is alive; a zombie
// (exited, not yet reaped) is not.
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	return !isZombie(pid)
}

// quitProcess asks postgres for an immediate shutdown.
func quitProcess(p *os.Process) error {
	return p.Signal(syscall.SIGQUIT)
}

func fileOwner(info fs.FileInfo) (uid, gid int, ok bool) {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, false
	}
	return int(st.Uid), int(st.Gid), true
}

// crashProcess kills p with SIGKILL, as a crash would, and each of its children the platform can
// list, having first stopped p so that it cannot start another meanwhile. It returns the children,
// which are not ours to wait for.
func crashProcess(p *os.Process) []int {
	_ = p.Signal(syscall.SIGSTOP)
	children := childPIDs(p.Pid)
	_ = p.Signal(syscall.SIGKILL)
	for _, pid := range children {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return children
}
