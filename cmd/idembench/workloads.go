package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
)

// workloadKind says what a load workload measures, and so where the report
// shows it.
type workloadKind int

const (
	// kindFlow is the three-step rides request with a new key each time:
	// framework overhead (section 1), the plot, the commit ceiling's shares.
	kindFlow workloadKind = iota
	// kindReplay is the replay path and what it is measured against.
	kindReplay
	// kindCommit is the commit ceiling.
	kindCommit
)

// workload is one entry of the load section. Adding a workload is adding
// one entry to workloads: its figures then appear in every table of its
// kind, and a flow marked runner gets its own target rows against the
// baseline and the single-transaction contender.
type workload struct {
	name  string // its -workloads name
	label string // what the report and the plot call it
	kind  workloadKind
	// runner marks a flow that goes through idem's Runner; the targets
	// judge each such flow.
	runner bool
	// commits is a flow's commits per request, for the commit ceiling.
	commits int
	// op builds the request the workload's workers send.
	op func(d *loadDeps) op
}

// workloads are the load section's workloads, in the report's order.
var workloads = []workload{
	{name: "runner", label: "runner", runner: true, commits: 4,
		op: func(d *loadDeps) op { return d.runnerOp("r", newRunnerFlow()) }},
	{name: "runner-joined", label: "runner, receipt joined", runner: true, commits: 3,
		op: func(d *loadDeps) op { return d.runnerOp("rj", newRidesFlow(joinReceipt)) }},
	{name: "runner-onetx", label: "runner, all joined", runner: true, commits: 2,
		op: func(d *loadDeps) op { return d.runnerOp("r1", newRidesFlow(joinAll)) }},
	{name: "baseline", label: "baseline", commits: 4,
		op: func(d *loadDeps) op { return d.baselineOp("b", (&baseline{pool: d.pool, pipelined: true}).run) }},
	{name: "single", label: "single tx", commits: 2,
		op: func(d *loadDeps) op { return d.baselineOp("s", (&single{pool: d.pool}).run) }},
	{name: "plain", label: "plain tx", commits: 4,
		op: func(d *loadDeps) op { return d.baselineOp("p", (&baseline{pool: d.pool}).run) }},
	{name: "replay", label: "replay", kind: kindReplay, op: (*loadDeps).replayOp},
	{name: "baseline-replay", label: "baseline replay", kind: kindReplay, op: (*loadDeps).baselineReplayOp},
	{name: "select", label: "plain SELECT", kind: kindReplay, op: (*loadDeps).selectOp},
	{name: "commit", label: "INSERT+commit", kind: kindCommit, op: (*loadDeps).commitOp},
}

// allWorkloads are the workloads' names, in order.
var allWorkloads = func() []string {
	var names []string
	for _, w := range workloads {
		names = append(names, w.name)
	}
	return names
}()

// workloadNamed returns the entry called name, nil if there is none.
func workloadNamed(name string) *workload {
	for i := range workloads {
		if workloads[i].name == name {
			return &workloads[i]
		}
	}
	return nil
}

// loadDeps is what the workloads' requests are made of, shared by all of
// them in one run.
type loadDeps struct {
	pool   *pgxpool.Pool
	runner *idem.Runner
	// run and seq make keys never used before, across rounds and
	// concurrencies.
	run string
	seq atomic.Int64
	// The replay workloads pick from finished keys made beforehand.
	replayInputs []rideInput
	replayIDs    []int64
}

// newKey is a scope and a key never used before, for worker w.
func (d *loadDeps) newKey(prefix string, w int) (string, string) {
	return "user:" + strconv.Itoa(w), prefix + "-" + d.run + "-" + strconv.FormatInt(d.seq.Add(1), 10)
}

func requestInput(w, i int) rideInput {
	return rideInput{UserID: int64(w), Origin: "SF", Amount: int64(2000 + i%100)}
}

func replayKey(i int) string { return "replay-" + strconv.Itoa(i) }

// execute sends a rides request for scope and key through runner; any
// outcome but want is an error.
func execute(ctx context.Context, runner *idem.Runner, flow *idem.Flow[rideInput], scope, key string, in rideInput, want idem.OutcomeKind) error {
	out, err := runner.Execute(ctx, flow, idem.Request{Scope: scope, Key: key, Path: "/rides", Params: in})
	if err == nil && out.Kind != want {
		err = fmt.Errorf("outcome %s, want %s", out.Kind, want)
	}
	return err
}

// runnerOp runs flow through the runner with a new key (prefixed with
// prefix) per request; any outcome but executed is an error.
func (d *loadDeps) runnerOp(prefix string, flow *idem.Flow[rideInput]) op {
	return func(ctx context.Context, w, i int) error {
		scope, key := d.newKey(prefix, w)
		return execute(ctx, d.runner, flow, scope, key, requestInput(w, i), idem.OutcomeExecuted)
	}
}

// baselineOp runs a hand-rolled implementation with a new key per request;
// a replay is an error.
func (d *loadDeps) baselineOp(prefix string, run func(ctx context.Context, scope, key string, in rideInput) (*baseResult, error)) op {
	return func(ctx context.Context, w, i int) error {
		scope, key := d.newKey(prefix, w)
		res, err := run(ctx, scope, key, requestInput(w, i))
		if err == nil && res.replayed {
			err = errors.New("replayed, want executed")
		}
		return err
	}
}

func (d *loadDeps) replayOp() op {
	flow := newRunnerFlow()
	return func(ctx context.Context, w, i int) error {
		n := rand.IntN(len(d.replayInputs))
		out, err := d.runner.Execute(ctx, flow, idem.Request{Scope: "user:replay", Key: replayKey(n), Path: "/rides", Params: d.replayInputs[n]})
		if err == nil && (out.Kind != idem.OutcomeReplayed || out.Response.Status != 201) {
			err = fmt.Errorf("outcome %s, want a replayed 201", out.Kind)
		}
		return err
	}
}

// baselineReplayOp replays the baseline's finished keys: its claim finds
// the key, and a second statement reads it.
func (d *loadDeps) baselineReplayOp() op {
	base := &baseline{pool: d.pool, pipelined: true}
	return func(ctx context.Context, w, i int) error {
		n := rand.IntN(len(d.replayInputs))
		res, err := base.run(ctx, "user:replay", replayKey(n), d.replayInputs[n])
		if err == nil && (!res.replayed || res.status != 201) {
			err = fmt.Errorf("replayed %v, status %d: want a replayed 201", res.replayed, res.status)
		}
		return err
	}
}

func (d *loadDeps) selectOp() op {
	return func(ctx context.Context, w, i int) error {
		var (
			status       int
			header, body []byte
		)
		return d.pool.QueryRow(ctx, "SELECT response_status, response_headers, response_body FROM idem_keys WHERE id = $1",
			d.replayIDs[rand.IntN(len(d.replayIDs))]).Scan(&status, &header, &body)
	}
}

func (d *loadDeps) commitOp() op {
	return func(ctx context.Context, w, i int) error {
		_, err := d.pool.Exec(ctx, "INSERT INTO commit_probe (worker, n) VALUES ($1, $2)", w, i)
		return err
	}
}
