package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// cpuMeter reads the CPU time this process and the server backends of the
// benchmark's pool have used so far. On a machine where the client and
// Postgres share the cores, CPU time per request is what throughput is
// made of; it says which side a difference comes from.
type cpuMeter struct {
	// backends are the server processes of the pool's connections; empty
	// when the server is not on this machine (or /proc is not readable).
	backends []int
}

// userHZ is the unit of the times in /proc/<pid>/stat: USER_HZ, which the
// Linux ABI fixes at 100.
const userHZ = 100

// newCPUMeter finds the backend of every connection of pool, which must
// hold all its connections open (MinConns = MaxConns), and keeps those it
// can read in /proc.
func newCPUMeter(ctx context.Context, pool *pgxpool.Pool) (*cpuMeter, error) {
	n := int(pool.Config().MaxConns)
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	m := &cpuMeter{}
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		conns = append(conns, c)
		var pid int
		if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			return nil, err
		}
		if _, err := procCPU(pid); err == nil {
			m.backends = append(m.backends, pid)
		}
	}
	if len(m.backends) < n {
		m.backends = nil // not all of them: the server is elsewhere
	}
	return m, nil
}

// cpuSample is CPU used so far; server is negative when unknown.
type cpuSample struct{ client, server time.Duration }

func (m *cpuMeter) sample() cpuSample {
	s := cpuSample{client: processCPU(), server: -1}
	if m == nil || len(m.backends) == 0 {
		return s
	}
	s.server = 0
	for _, pid := range m.backends {
		d, err := procCPU(pid)
		if err != nil {
			// A backend gone (the pool replaced a connection): the sum
			// is no longer comparable.
			s.server = -1
			return s
		}
		s.server += d
	}
	return s
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU is the user and system time of process pid, from /proc.
func procCPU(pid int) (time.Duration, error) {
	return procTicks(pid, 2)
}

// procTicks sums n of the CPU time fields of /proc/<pid>/stat from utime on
// (utime, stime, cutime, cstime: fields 14 to 17), as a duration.
func procTicks(pid, n int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces;
	// utime is field 14, the 12th after it.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 11+n {
		return 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	var ticks int64
	for _, field := range f[11 : 11+n] {
		t, err := strconv.ParseInt(field, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
		}
		ticks += t
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}
