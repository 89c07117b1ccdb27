package demo

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// readyTimeout bounds a serve process's start: migrations, seeding, listen.
const readyTimeout = time.Minute

// fleet is the serve processes. Each slot keeps its port across restarts,
// so the simulator's targets never change.
type fleet struct {
	cfg         *Config
	dbURL       string
	paymentsURL string
	logDir      string
	say         func(format string, args ...any)

	mu       sync.Mutex
	servers  []*server
	stopping bool

	kills      atomic.Int64
	unexpected atomic.Int64
	supervise  sync.WaitGroup
}

// server is one slot's current process.
type server struct {
	slot   int
	port   int
	cmd    *exec.Cmd
	exited chan struct{}
	// killed is set before the demo kills or stops the process, so its exit
	// is not taken for a crash.
	killed atomic.Bool
}

func (s *server) url() string { return "http://127.0.0.1:" + strconv.Itoa(s.port) }

func (f *fleet) targets() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, len(f.servers))
	for i, s := range f.servers {
		out[i] = s.url()
	}
	return out
}

// startAll starts every slot and waits until each answers.
func (f *fleet) startAll(ctx context.Context) error {
	for slot := range f.cfg.Servers {
		port, err := freePort()
		if err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		s, err := f.start(slot, port)
		if err != nil {
			return err
		}
		f.mu.Lock()
		f.servers = append(f.servers, s)
		f.mu.Unlock()
	}
	for _, s := range f.servers {
		if err := f.waitReady(ctx, s); err != nil {
			return err
		}
		f.say("serve %d: %s (pid %d)", s.slot+1, s.url(), s.cmd.Process.Pid)
	}
	return nil
}

// start launches slot's serve process.
func (f *fleet) start(slot, port int) (*server, error) {
	logFile, err := os.OpenFile(filepath.Join(f.logDir, fmt.Sprintf("serve-%d.log", slot+1)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	s := &server{slot: slot, port: port, exited: make(chan struct{})}
	s.cmd = exec.Command(f.cfg.Executable, "serve",
		"--addr", "127.0.0.1:"+strconv.Itoa(port),
		"--lease", f.cfg.Lease.String(),
		// Abandoned keys are the clients' to retry; the completer is the
		// safety net for those nobody retries, so it waits a little longer.
		"--complete-idle", (4 * f.cfg.Lease).String(),
		"--complete-interval", f.cfg.Lease.String(),
		// A receipt job whose process was killed mid-run is rescued quickly.
		"--job-timeout", "5s",
		"--job-rescue-after", "10s",
	)
	s.cmd.Env = append(os.Environ(), "DATABASE_URL="+f.dbURL, "PAYMENTS_URL="+f.paymentsURL)
	s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
	configureChild(s.cmd)
	if err := s.cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("demo: start serve %d: %w", slot+1, err)
	}
	f.supervise.Go(func() {
		_ = s.cmd.Wait()
		logFile.Close()
		close(s.exited)
		f.exited(s)
	})
	return s, nil
}

// exited restarts a server that died without the demo killing it: that is
// a bug worth reporting, but the run carries on so the audit can show what
// it cost.
func (f *fleet) exited(s *server) {
	if s.killed.Load() {
		return
	}
	f.mu.Lock()
	stopping := f.stopping
	f.mu.Unlock()
	if stopping {
		return
	}
	f.unexpected.Add(1)
	f.say("serve %d (pid %d) exited on its own (%v); restarting it; see %s", s.slot+1, s.cmd.Process.Pid, s.cmd.ProcessState,
		filepath.Join(f.logDir, fmt.Sprintf("serve-%d.log", s.slot+1)))
	f.replace(context.Background(), s)
}

// replace starts a new process in s's slot.
func (f *fleet) replace(ctx context.Context, s *server) {
	f.mu.Lock()
	if f.stopping {
		f.mu.Unlock()
		return
	}
	next, err := f.start(s.slot, s.port)
	if err == nil {
		f.servers[s.slot] = next
	}
	f.mu.Unlock()
	if err != nil {
		f.say("%v", err)
		return
	}
	if err := f.waitReady(ctx, next); err != nil && ctx.Err() == nil {
		f.say("%v", err)
	}
}

// waitReady polls the server's health check until it answers, the process
// exits or readyTimeout passes. Polling is what there is: the server is
// another process.
func (f *fleet) waitReady(ctx context.Context, s *server) error {
	deadline := time.Now().Add(readyTimeout)
	client := &http.Client{Timeout: time.Second}
	for {
		resp, err := client.Get(s.url() + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: serve %d did not become ready within %s; see its log in %s", s.slot+1, readyTimeout, f.logDir)
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-s.exited:
			t.Stop()
			return fmt.Errorf("demo: serve %d exited while starting (%v); see its log in %s", s.slot+1, s.cmd.ProcessState, f.logDir)
		case <-t.C:
		}
	}
}

// killLoop kills a random server with SIGKILL at random moments around
// KillEvery, and restarts it, until traffic is done. Restarts wait on ctx,
// so a kill just before the end is still followed by a restart.
func (f *fleet) killLoop(traffic, ctx context.Context) {
	for {
		t := time.NewTimer(jittered(f.cfg.KillEvery))
		select {
		case <-traffic.Done():
			t.Stop()
			return
		case <-t.C:
		}
		f.mu.Lock()
		s := f.servers[rand.N(len(f.servers))]
		f.mu.Unlock()
		select {
		case <-s.exited:
			continue // already down (a crash being restarted)
		default:
		}
		s.killed.Store(true)
		if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
			f.say("kill serve %d: %v", s.slot+1, err)
			continue
		}
		<-s.exited
		f.kills.Add(1)
		f.replace(ctx, s)
	}
}

// stopAll stops every server: SIGTERM, which lets it finish its requests,
// then SIGKILL for one that takes longer than 15s.
func (f *fleet) stopAll() {
	f.mu.Lock()
	f.stopping = true
	servers := append([]*server(nil), f.servers...)
	f.mu.Unlock()
	for _, s := range servers {
		s.killed.Store(true)
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, s := range servers {
		select {
		case <-s.exited:
		case <-time.After(15 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
	f.supervise.Wait()
}
