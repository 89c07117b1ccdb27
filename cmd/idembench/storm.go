package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-idem/idem"
)

// stormReport is what the duplicate storm found.
type stormReport struct {
	Size, Rounds int
	// Exact counts the rounds with exactly one execution: one executed
	// outcome, each phase committed once, one ride and one job.
	Exact    int
	Outcomes map[idem.OutcomeKind]int
	Losers   *stats
	Winners  *stats
	// Problems describes every round that was not exact.
	Problems []string
}

// measureStorm sends size identical requests at once, rounds times, each
// round with a new key, and checks that exactly one of them executed.
func measureStorm(ctx context.Context, e *env, size, rounds int) (*stormReport, error) {
	// commits counts phase commits per key, from the runner's own events.
	var mu sync.Mutex
	commits := map[string]int{}
	runner, store, err := newRunner(e.pool, e.schema, idem.Config{Observer: idem.ObserverFunc(func(_ context.Context, ev idem.Event) {
		if ev.Kind == idem.EventPhaseCommitted {
			mu.Lock()
			commits[ev.Key]++
			mu.Unlock()
		}
	})})
	if err != nil {
		return nil, err
	}
	defer store.Close()
	flow := newRunnerFlow()
	phases := len(flow.PhaseNames())
	rep := &stormReport{Size: size, Rounds: rounds, Outcomes: map[idem.OutcomeKind]int{}}
	var winners, losers []time.Duration
	run := randomHex(4)
	// Round -1 is a warm-up, checked but not counted: it makes the pool's
	// connections that the load section never used prepare their
	// statements, which is a cold start rather than a storm.
	for r := -1; r < rounds; r++ {
		key := fmt.Sprintf("storm-%s-%d", run, r)
		in := rideInput{UserID: int64(r), Origin: "storm", Amount: 1500}
		type result struct {
			kind idem.OutcomeKind
			err  error
			took time.Duration
		}
		results := make([]result, size)
		var ready, wg sync.WaitGroup
		start := make(chan struct{})
		var executed atomic.Int64
		for i := range size {
			ready.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				ready.Done()
				<-start
				began := time.Now()
				out, err := runner.Execute(ctx, flow, idem.Request{Scope: "user:storm", Key: key, Path: "/rides", Params: in})
				results[i] = result{out.Kind, err, time.Since(began)}
				if out.Kind == idem.OutcomeExecuted {
					executed.Add(1)
				}
			}()
		}
		ready.Wait() // every request is waiting at the gate
		close(start)
		wg.Wait()

		var problems []string
		for _, res := range results {
			counted := r >= 0
			if counted {
				rep.Outcomes[res.kind]++
			}
			switch {
			case res.kind == idem.OutcomeExecuted:
				if counted {
					winners = append(winners, res.took)
				}
			case res.kind == idem.OutcomeInProgress && errors.Is(res.err, idem.ErrInProgress),
				res.kind == idem.OutcomeReplayed && res.err == nil:
				if counted {
					losers = append(losers, res.took)
				}
			default:
				problems = append(problems, fmt.Sprintf("outcome %s: %v", res.kind, res.err))
			}
		}
		var rides, jobs int
		if err := e.pool.QueryRow(ctx, `
			SELECT count(DISTINCT r.id), count(j.id)
			FROM idem_keys k
			JOIN runner_rides r ON r.key_id = k.id
			LEFT JOIN runner_jobs j ON j.ride_id = r.id
			WHERE k.scope = 'user:storm' AND k.key = $1 AND k.status = 'finished'`, key).Scan(&rides, &jobs); err != nil {
			return nil, fmt.Errorf("storm round %d: count executions: %w", r, err)
		}
		mu.Lock()
		committed := commits[key]
		mu.Unlock()
		if n := executed.Load(); n != 1 {
			problems = append(problems, fmt.Sprintf("%d executed outcomes", n))
		}
		if committed != phases || rides != 1 || jobs != 1 {
			problems = append(problems, fmt.Sprintf("%d phase commits (want %d), %d rides, %d jobs", committed, phases, rides, jobs))
		}
		switch {
		case len(problems) > 0 && r < 0:
			rep.Problems = append(rep.Problems, fmt.Sprintf("warm-up round: %v", problems))
		case len(problems) > 0:
			rep.Problems = append(rep.Problems, fmt.Sprintf("round %d: %v", r, problems))
		case r >= 0:
			rep.Exact++
		}
	}
	rep.Winners = newStats(winners, 0)
	rep.Losers = newStats(losers, 0)
	return rep, nil
}
