package idem_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/internal/pgtest"
	"github.com/go-idem/idem/internal/testfixture"
	"github.com/go-idem/idem/pgstore"
)

// bouncedModes are the query exec modes that work through PgBouncer 1.18
// in transaction mode; pgstore.New refuses the others there.
var bouncedModes = []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeSimpleProtocol}

// setupBounced is setup with the store reaching its schema through the
// test binary's pgbouncer (transaction pooling) in mode.
func setupBounced(t *testing.T, mode pgx.QueryExecMode) *testBundle {
	t.Helper()
	bounced := pgtest.NewBouncedSchema(t)
	b := setupOn(t, bounced.Schema)
	b.store = bouncedStore(t, bounced, mode)
	return b
}

// The runner's lease machinery through PgBouncer in transaction mode, in
// each exec mode that works there: a crash leaves the key locked until its
// lease expires, then another worker takes it over; fencing stops the
// worker it was taken from; heartbeats keep a slow phase's lease; two
// Maintainers reap, complete and reconcile without double work.
func TestRunnerThroughPgBouncer(t *testing.T) {
	t.Parallel()
	for _, mode := range bouncedModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			t.Run("crash then takeover", func(t *testing.T) {
				t.Parallel()
				crashLeavesKeyLockedUntilLeaseExpires(t, setupBounced(t, mode))
			})
			t.Run("fencing", func(t *testing.T) {
				t.Parallel()
				fencingStopsATakenOverWorker(t, setupBounced(t, mode))
			})
			t.Run("heartbeat", func(t *testing.T) {
				t.Parallel()
				heartbeatKeepsASlowPhaseLease(t, setupBounced(t, mode))
			})
			t.Run("maintainers", func(t *testing.T) {
				t.Parallel()
				twoMaintainersDoNoDoubleWork(t, setupSMSOn(t, setupBounced(t, mode)))
			})
		})
	}
}

// killedChildEnv makes the test binary the worker that TestKill9ThroughPgBouncer
// kills: see runKilledChild.
const killedChildEnv = "IDEM_TEST_KILLED_CHILD"

// runKilledChild is a worker process: it runs key "k1" of the ride flow
// through the (bouncer) URL in its environment, in the exec mode and as the
// store instance it names,
// and in its second phase, with a write of its own made, it says "inside"
// and waits to be killed.
func runKilledChild() int {
	ctx := context.Background()
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "killed child:", err); return 1 }
	cfg, err := pgxpool.ParseConfig(os.Getenv(killedChildEnv + "_URL"))
	if err != nil {
		return fail(err)
	}
	for _, mode := range bouncedModes {
		if mode.String() == os.Getenv(killedChildEnv+"_MODE") {
			cfg.ConnConfig.DefaultQueryExecMode = mode
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fail(err)
	}
	store, err := pgstore.New(pool, &pgstore.Config{Schema: os.Getenv(killedChildEnv + "_SCHEMA"), Instance: os.Getenv(killedChildEnv + "_INSTANCE")})
	if err != nil {
		return fail(err)
	}
	b := &testBundle{provider: &testfixture.Provider{}, counts: &testfixture.PhaseCounts{},
		hooks: map[string]func(context.Context, idem.Tx, *idem.Attempt[rideInput]) error{}}
	b.flow = b.rideFlow("rides.create")
	b.hooks["charge_created"] = func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) error {
		if _, err := tx.Exec(ctx, `UPDATE rides SET origin = 'written by the killed worker'`); err != nil {
			return err
		}
		fmt.Println("inside")
		select {} // until SIGKILL
	}
	r, err := idem.NewRunner(store, &idem.Config{Flows: []idem.AnyFlow{b.flow}})
	if err != nil {
		return fail(err)
	}
	_, err = r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "Paris", Amount: 7}))
	return fail(fmt.Errorf("the flow ended: %v", err))
}

// killChildInPhase starts the test binary as runKilledChild with the
// environment settings given (each "_NAME=value", for killedChildEnv+"_NAME"),
// waits for it to be inside its phase, kills it with SIGKILL and returns its
// pid once it is gone.
func killChildInPhase(ctx context.Context, t *testing.T, env ...string) int {
	t.Helper()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), killedChildEnv+"=1")
	for _, e := range env {
		cmd.Env = append(cmd.Env, killedChildEnv+e)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := bufio.NewScanner(stdout)
	require.True(t, lines.Scan() && lines.Text() == "inside", "the worker never reached its phase: %s", stderr.String())
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	return cmd.Process.Pid
}

// A worker killed with SIGKILL in the middle of a phase, its transaction
// open on a server connection PgBouncer lent it: the bouncer rolls the
// transaction back, and after the lease another worker through the same
// bouncer takes the key over and finishes it from its recovery point.
func TestKill9ThroughPgBouncer(t *testing.T) {
	t.Parallel()
	for _, mode := range bouncedModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			bounced := pgtest.NewBouncedSchema(t)
			b := setupOn(t, bounced.Schema)
			b.store = bouncedStore(t, bounced, mode)
			b.clock = idemtest.NewClock(time.Now())
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()

			killChildInPhase(ctx, t, "_URL="+bounced.BouncedURL, "_SCHEMA="+bounced.Name, "_MODE="+mode.String())
			require.True(t, bounced.Bouncer.Alive(), "pgbouncer exited:\n%s", bounced.Bouncer.Log())

			rec := b.key(t, "k1")
			require.Equal(t, "ride_created", rec.RecoveryPoint)
			require.NotNil(t, rec.LockedAt, "a killed worker releases nothing")

			r := b.runner(t, nil)
			out, err := r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "Paris", Amount: 7}))
			require.ErrorIs(t, err, idem.ErrInProgress, "inside the killed worker's lease")
			require.Equal(t, idem.OutcomeInProgress, out.Kind)

			b.clock.Advance(2 * time.Hour)
			out, err = r.Execute(ctx, b.flow, b.request("k1", rideInput{Origin: "Paris", Amount: 7}))
			require.NoError(t, err)
			require.Equal(t, http.StatusCreated, out.Response.Status)
			require.True(t, out.TookOver)
			require.Equal(t, 1, b.countRows(t, "rides"))
			require.Equal(t, 1, b.countRows(t, "rides WHERE origin = 'Paris'"), "the killed worker's write rolled back")
			require.Equal(t, 1, b.countRows(t, "jobs"))
			require.Equal(t, 1, b.provider.Charges())
			t.Logf("%s: killed in phase charge_created, taken over at fence %d, finished %d", mode, b.key(t, "k1").Fence, out.Response.Status)
		})
	}
}
