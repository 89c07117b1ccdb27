package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// op is one request of a workload, by worker w; i counts that worker's
// requests from 0.
type op func(ctx context.Context, w, i int) error

// stats summarise one measured point.
type stats struct {
	Ops     int
	Elapsed time.Duration
	P50     time.Duration
	P99     time.Duration
	// WALPerOp is the write-ahead log the server wrote per operation
	// (warm-up included), when measured.
	WALPerOp float64
	// ClientCPU and ServerCPU are the CPU time per operation of this
	// process and of the pool's server backends (warm-up included);
	// ServerCPU is negative when unknown.
	ClientCPU, ServerCPU time.Duration
	// lat are the sorted latencies, kept to merge rounds.
	lat []time.Duration
	// walBytes, allOps, clientCPU and serverCPU accumulate the per-op
	// figures over rounds.
	walBytes, allOps     int64
	clientCPU, serverCPU time.Duration
}

// perOp recomputes the per-operation figures from the totals.
func (s *stats) perOp() {
	n := max(s.allOps, 1)
	s.WALPerOp = float64(s.walBytes) / float64(n)
	s.ClientCPU = s.clientCPU / time.Duration(n)
	s.ServerCPU = -1
	if s.serverCPU >= 0 {
		s.ServerCPU = s.serverCPU / time.Duration(n)
	}
}

// Throughput is operations per second.
func (s *stats) Throughput() float64 {
	if s == nil || s.Elapsed <= 0 {
		return 0
	}
	return float64(s.Ops) / s.Elapsed.Seconds()
}

// merge adds another round of the same point.
func (s *stats) merge(o *stats) {
	s.Ops += o.Ops
	s.Elapsed += o.Elapsed
	s.walBytes += o.walBytes
	s.allOps += o.allOps
	s.clientCPU += o.clientCPU
	if s.serverCPU < 0 || o.serverCPU < 0 {
		s.serverCPU = -1
	} else {
		s.serverCPU += o.serverCPU
	}
	s.perOp()
	s.lat = append(s.lat, o.lat...)
	slices.Sort(s.lat)
	s.P50, s.P99 = percentile(s.lat, 0.50), percentile(s.lat, 0.99)
}

// percentile is the nearest-rank percentile of sorted latencies.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

func newStats(lat []time.Duration, elapsed time.Duration) *stats {
	slices.Sort(lat)
	return &stats{Ops: len(lat), Elapsed: elapsed, lat: lat, P50: percentile(lat, 0.50), P99: percentile(lat, 0.99)}
}

// closedLoop runs conc workers, each sending its next request as soon as
// the last one answered, for warmup and then d. Only requests started after
// the warm-up count; the window ends when the last of them answers. An
// error from any request stops the measurement: a benchmark that quietly
// counts failures as throughput measures nothing.
func closedLoop(ctx context.Context, conc int, warmup, d time.Duration, fn op) (*stats, error) {
	lats, window, err := drive(ctx, conc, warmup, d, nil, fn)
	if err != nil {
		return nil, err
	}
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	return newStats(all, window), nil
}

// drive is closedLoop's engine. It stops starting requests after warmup+d,
// or as soon as stop is closed (nil never closes), and returns each
// worker's latencies and the measured window.
func drive(ctx context.Context, conc int, warmup, d time.Duration, stop <-chan struct{}, fn op) ([][]time.Duration, time.Duration, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	start := time.Now()
	measureFrom := start.Add(warmup)
	stopAt := measureFrom.Add(d)
	lats := make([][]time.Duration, conc)
	ends := make([]time.Time, conc)
	var wg sync.WaitGroup
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, 4096)
			defer func() { lats[w] = lat }()
			for i := 0; ; i++ {
				began := time.Now()
				if !began.Before(stopAt) || ctx.Err() != nil || closed(stop) {
					return
				}
				if err := fn(ctx, w, i); err != nil {
					cancel(fmt.Errorf("worker %d request %d: %w", w, i, err))
					return
				}
				if !began.Before(measureFrom) {
					ended := time.Now()
					lat = append(lat, ended.Sub(began))
					ends[w] = ended
				}
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, 0, err
	}
	// The window runs to the last answer, and at least to the planned end
	// (or to when stop closed): a worker descheduled across the end still
	// spent that time.
	last := stopAt
	if now := time.Now(); now.Before(last) {
		last = now
	}
	for _, end := range ends {
		if end.After(last) {
			last = end
		}
	}
	return lats, last.Sub(measureFrom), nil
}

func closed(c <-chan struct{}) bool {
	if c == nil {
		return false
	}
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// variant is one workload measured side by side with others.
type variant struct {
	name string
	op   op
}

// runMeter measures what one run of a variant cost beside its latencies:
// called before the run, it returns what to call after it, with the run's
// stats (allOps counted), to record those costs.
type runMeter func(ctx context.Context, v variant) (after func(s *stats) error, err error)

// interleaved measures every variant at conc for d in total each, split
// into rounds whose order alternates, so a slow spell on a shared machine
// (another process, a checkpoint, autovacuum) lands on all of them rather
// than on whichever happened to run then. meter, when not nil, measures the
// costs of each run.
func interleaved(ctx context.Context, conc, rounds int, warmup, d time.Duration, variants []variant, meter runMeter) (map[string]*stats, error) {
	out := map[string]*stats{}
	per := d / time.Duration(rounds)
	for r := range rounds {
		order := slices.Clone(variants)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, v := range order {
			var ops atomic.Int64
			counted := func(ctx context.Context, w, i int) error {
				ops.Add(1)
				return v.op(ctx, w, i)
			}
			after := func(*stats) error { return nil }
			if meter != nil {
				var err error
				if after, err = meter(ctx, v); err != nil {
					return nil, err
				}
			}
			s, err := closedLoop(ctx, conc, warmup, per, counted)
			if err != nil {
				return nil, fmt.Errorf("%s at concurrency %d: %w", v.name, conc, err)
			}
			s.allOps = ops.Load()
			if err := after(s); err != nil {
				return nil, err
			}
			s.perOp()
			if out[v.name] == nil {
				out[v.name] = s
			} else {
				out[v.name].merge(s)
			}
		}
	}
	return out, nil
}

// warmPool runs every variant at conc for d, unmeasured. pgx prepares each
// statement once per connection, and Postgres plans a prepared statement
// afresh for its first five runs on each (the acquisition statement takes
// milliseconds to plan). That cold start is real but happens once per
// connection, and would otherwise land on whichever point first uses more
// connections than the ones before.
func warmPool(ctx context.Context, conc int, d time.Duration, variants []variant) error {
	for _, v := range variants {
		if _, err := closedLoop(ctx, conc, 0, d, v.op); err != nil {
			return fmt.Errorf("warm up %s: %w", v.name, err)
		}
	}
	return nil
}
