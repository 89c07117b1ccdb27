//go:build !unix

package pgtest

import (
	"io/fs"
	"os"
	"os/exec"
)

// localSupported is false: throwaway clusters rely on Unix process control.
const localSupported = false

func configureChild(*exec.Cmd, *runAs) {}

// processAlive assumes the worst, so nothing that may be in use is removed.
func processAlive(int) bool { return true }

func quitProcess(p *os.Process) error { return p.Kill() }

func fileOwner(fs.FileInfo) (uid, gid int, ok bool) { return 0, 0, false }

func crashProcess(p *os.Process) []int {
	_ = p.Kill()
	return nil
}

func removeSysVSegment(int) error { return nil }
