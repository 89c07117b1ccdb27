// Package demo runs the whole rides example on one machine with nothing set
// up: a throwaway Postgres (unless DatabaseURL names one), fakepay with its
// faults on, several serve processes, and the simulator, which drives them
// and audits the result. With KillEvery, serve processes are killed with
// SIGKILL at random moments and restarted, so requests die mid-phase with
// their keys locked, exactly as in a real crash.
//
// The serve processes are real child processes of the same binary
// (os.Executable), so a crash is a crash: no deferred function runs, no
// transaction commits, no lock is released, and the surviving processes
// and retries have to cope.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem/examples/rides/fakepay"
	"github.com/go-idem/idem/examples/rides/internal/simulate"
	"github.com/go-idem/idem/internal/pgtest"
)

// Config configures a demo run. The zero value runs the default demo.
type Config struct {
	// DatabaseURL is the database to use. Empty starts a throwaway Postgres
	// (see internal/pgtest: TEST_DATABASE_URL, local binaries or Docker) and
	// removes it afterwards.
	DatabaseURL string

	// Executable is the binary whose "serve" command runs the servers.
	// Default os.Executable().
	Executable string

	// Servers is how many serve processes run. Default 2.
	Servers int

	// Clients, Duration: see simulate.Config. Defaults 8 and 20s.
	Clients  int
	Duration time.Duration

	// KillEvery, when positive, kills a random serve process with SIGKILL
	// at a random moment between KillEvery/2 and 3*KillEvery/2 after the
	// last kill, and restarts it, while the traffic runs.
	KillEvery time.Duration

	// FailRate, DropRate and Latency are fakepay's faults (see
	// fakepay.Config). Defaults 0.05, 0.05 and 25ms; negative means none.
	FailRate float64
	DropRate float64
	Latency  time.Duration

	// Lease is the serve processes' idem lease: how long a killed process
	// holds its keys. Default 3s (idem's default is 90s).
	Lease time.Duration

	// Drain bounds how long the simulator waits for requests in flight and
	// background work at the end. Default 90s: a receipt job stranded by a
	// killed server is rescued by River within about a minute.
	Drain time.Duration

	// LogDir receives the serve processes' and fakepay's logs. Default: a
	// new temporary directory, kept after the run.
	LogDir string

	// Out receives the progress lines and the summary. Default os.Stdout.
	Out io.Writer
}

func (c *Config) withDefaults() (*Config, error) {
	out := *c
	if out.Executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("demo: find this program's binary: %w", err)
		}
		out.Executable = exe
	}
	if out.Servers == 0 {
		out.Servers = 2
	}
	if out.Servers < 1 {
		return nil, fmt.Errorf("demo: Servers %d: need at least one", out.Servers)
	}
	if out.Clients == 0 {
		out.Clients = 8
	}
	if out.Duration == 0 {
		out.Duration = 20 * time.Second
	}
	if out.KillEvery < 0 {
		return nil, fmt.Errorf("demo: KillEvery %s is negative", out.KillEvery)
	}
	rate := func(v *float64) {
		switch {
		case *v == 0:
			*v = 0.05
		case *v < 0:
			*v = 0
		}
	}
	rate(&out.FailRate)
	rate(&out.DropRate)
	switch {
	case out.Latency == 0:
		out.Latency = 25 * time.Millisecond
	case out.Latency < 0:
		out.Latency = 0
	}
	if out.Lease == 0 {
		out.Lease = 3 * time.Second
	}
	if out.Drain == 0 {
		out.Drain = 90 * time.Second
	}
	if out.Out == nil {
		out.Out = os.Stdout
	}
	return &out, nil
}

// Result is a finished demo run.
type Result struct {
	// Report is the simulator's audit.
	Report *simulate.Report
	// Kills counts serve processes killed on purpose; UnexpectedExits those
	// that died on their own (each was restarted, and each is a bug).
	Kills           int
	UnexpectedExits int
	// LogDir holds the processes' logs.
	LogDir string
}

// OK reports whether every invariant held and no server died on its own.
func (r *Result) OK() bool { return r.Report.OK() && r.UnexpectedExits == 0 }

// WriteSummary prints the summary: the demo's own lines, then the
// simulator's, each "name: number", ending with "invariants violated: N".
func (r *Result) WriteSummary(w io.Writer) error {
	return r.Report.WriteSummary(w,
		simulate.SummaryLine{Name: "server kills", Value: r.Kills},
		simulate.SummaryLine{Name: "unexpected server exits", Value: r.UnexpectedExits, Invariant: true},
	)
}

// Run runs the demo until the simulation and its audit end or ctx is done,
// and always cleans up what it started: the servers, fakepay and the
// throwaway Postgres. The error is for a demo that could not run (or was
// interrupted); failed invariants are in the result.
func Run(ctx context.Context, config *Config) (result *Result, err error) {
	cfg, err := config.withDefaults()
	if err != nil {
		return nil, err
	}
	say := func(format string, args ...any) { fmt.Fprintf(cfg.Out, "rides demo: "+format+"\n", args...) }

	logDir := cfg.LogDir
	if logDir == "" {
		if logDir, err = os.MkdirTemp("", "rides-demo-"); err != nil {
			return nil, fmt.Errorf("demo: %w", err)
		}
	} else if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	say("logs in %s", logDir)

	// The database.
	dbURL := cfg.DatabaseURL
	if dbURL == "" {
		say("starting a throwaway Postgres (set DATABASE_URL to use your own)")
		server, err := pgtest.Start(ctx, &pgtest.Options{})
		if err != nil {
			return nil, fmt.Errorf("demo: %w", err)
		}
		defer func() {
			if cerr := server.Close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("demo: remove the throwaway Postgres: %w", cerr))
			}
		}()
		if dbURL, err = server.CreateDatabase(ctx, "rides_demo"); err != nil {
			return nil, fmt.Errorf("demo: %w", err)
		}
		say("postgres: %s server at %s, database %s", server.Kind(), serverAddr(dbURL), databaseName(dbURL))
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("demo: connect to the database: %w", err)
	}
	defer pool.Close()

	// The payment provider, in this process: it is the ledger of record,
	// and it is not one of the things being killed.
	fakepayLog, err := os.Create(filepath.Join(logDir, "fakepay.log"))
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	defer fakepayLog.Close()
	provider, err := fakepay.New(&fakepay.Config{
		FailRate: cfg.FailRate, DropRate: cfg.DropRate, Latency: cfg.Latency,
		Logger: slog.New(slog.NewTextHandler(fakepayLog, nil)),
	})
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	providerListener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	providerServer := &http.Server{Handler: provider, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = providerServer.Serve(providerListener) }()
	defer providerServer.Close()
	paymentsURL := "http://" + providerListener.Addr().String()
	say("fakepay: %s (fail rate %g, drop rate %g, latency %s)", paymentsURL, cfg.FailRate, cfg.DropRate, cfg.Latency)

	// The servers.
	fleet := &fleet{cfg: cfg, dbURL: dbURL, paymentsURL: paymentsURL, logDir: logDir, say: say}
	defer fleet.stopAll()
	if err := fleet.startAll(ctx); err != nil {
		return nil, err
	}

	// The traffic, with the killer alongside while it lasts.
	trafficCtx, stopKilling := context.WithTimeout(ctx, cfg.Duration)
	defer stopKilling()
	var killerDone sync.WaitGroup
	if cfg.KillEvery > 0 {
		say("simulating %d clients against %d servers for %s, killing a server every ~%s", cfg.Clients, cfg.Servers, cfg.Duration, cfg.KillEvery)
		killerDone.Go(func() { fleet.killLoop(trafficCtx, ctx) })
	} else {
		say("simulating %d clients against %d servers for %s", cfg.Clients, cfg.Servers, cfg.Duration)
	}
	report, err := simulate.Run(ctx, &simulate.Config{
		Targets:  fleet.targets(),
		Clients:  cfg.Clients,
		Duration: cfg.Duration,
		Drain:    cfg.Drain,
		Pool:     pool,
		Payments: &fakepay.Client{BaseURL: paymentsURL},
		Logger:   slog.New(slog.NewTextHandler(cfg.Out, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	stopKilling()
	killerDone.Wait()
	if err != nil {
		return nil, err
	}
	return &Result{Report: report, Kills: int(fleet.kills.Load()), UnexpectedExits: int(fleet.unexpected.Load()), LogDir: logDir}, nil
}

func databaseName(rawURL string) string {
	if c, err := pgxpool.ParseConfig(rawURL); err == nil {
		return c.ConnConfig.Database
	}
	return "?"
}

func serverAddr(rawURL string) string {
	if c, err := pgxpool.ParseConfig(rawURL); err == nil {
		return net.JoinHostPort(c.ConnConfig.Host, strconv.Itoa(int(c.ConnConfig.Port)))
	}
	return "?"
}

// freePort finds a free TCP port on the loopback interface for a slot,
// which keeps it across its process's restarts. It is taken below the
// kernel's ephemeral range: a port from that range (what listening on port
// 0 gives) is free while the slot's process restarts, and any outgoing
// connection on the machine (a pool's, a bouncer's) may take it as its
// local port meanwhile, so the restarted process cannot listen.
func freePort() (int, error) {
	low := ephemeralLow()
	for range 100 {
		port := 10000 + rand.N(max(low-10000, 1))
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue // taken: try another
		}
		l.Close()
		return port, nil
	}
	return 0, errors.New("no free port below the ephemeral range after 100 tries")
}

// ephemeralLow is the low end of the kernel's ephemeral port range: Linux's
// setting where it can be read, else IANA's 49152.
func ephemeralLow() int {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var low, high int
		if _, err := fmt.Sscan(string(b), &low, &high); err == nil && low > 10001 {
			return low
		}
	}
	return 49152
}

// jittered returns a duration uniformly between d/2 and 3d/2.
func jittered(d time.Duration) time.Duration {
	return d/2 + rand.N(d+1)
}
