package main

import (
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/go-idem/idem"
)

// Targets, as ratios measured in the same run.
// The load targets are judged at the reference concurrency, for every
// runner flow.
const (
	targetOverhead = 0.85 // runner/baseline throughput
	targetSingle   = 1.0  // runner/single-transaction contender throughput
	targetReplay   = 0.80 // runner replays / plain primary-key SELECTs
	targetWAL      = 1.2  // runner/baseline WAL bytes per request, at most
	targetCPU      = 1.2  // runner/baseline server CPU per request, at most
	targetClient   = 1.2  // runner/baseline client CPU per request, at most
	targetReplayB  = 1.0  // runner replays / the baseline's replays
	targetScale    = 1.5  // acquisition p99 at the large table / at the small one
	targetReaping  = 2.0  // acquisition p99 while reaping / without
)

// target is one verdict of the report.
type target struct {
	Name   string
	Figure string
	Met    bool
	// Unmeasured is a target this run could not judge (say, server CPU of
	// a server on another machine).
	Unmeasured bool
}

// loadTargets judges every runner flow at the reference point against the
// baseline and the single-transaction contender (throughput, WAL and server
// CPU per request), and replays against primary-key SELECTs.
func loadTargets(ref *loadPoint) []target {
	var through, costs []target
	base, single := ref.workload("baseline"), ref.workload("single")
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	for _, w := range workloadsOf(kindFlow) {
		r := ref.workload(w.name)
		if !w.runner || r == nil || base == nil || single == nil {
			continue
		}
		tb, ts := ratio(r.Throughput(), base.Throughput()), ratio(r.Throughput(), single.Throughput())
		wal := ratio(r.WALPerOp, base.WALPerOp)
		through = append(through,
			target{
				Name:   fmt.Sprintf("%s / baseline throughput >= %.2f at concurrency %d", w.label, targetOverhead, ref.Concurrency),
				Figure: fmt.Sprintf("%.2f (%s vs %s req/s)", tb, rate(r), rate(base)),
				Met:    tb >= targetOverhead,
			},
			target{
				Name:   fmt.Sprintf("%s / single tx throughput >= %.2f at concurrency %d", w.label, targetSingle, ref.Concurrency),
				Figure: fmt.Sprintf("%.2f (%s vs %s req/s)", ts, rate(r), rate(single)),
				Met:    ts >= targetSingle,
			})
		costs = append(costs,
			target{
				Name:   fmt.Sprintf("WAL bytes per request: %s / baseline <= %.1f at concurrency %d", w.label, targetWAL, ref.Concurrency),
				Figure: fmt.Sprintf("%.2f (%.0f vs %.0f B)", wal, r.WALPerOp, base.WALPerOp),
				Met:    wal <= targetWAL,
			})
		cpu := target{Name: fmt.Sprintf("server CPU per request: %s / baseline <= %.1f at concurrency %d", w.label, targetCPU, ref.Concurrency)}
		client := fmt.Sprintf("client %.2f (%.0f vs %.0f µs)", ratio(us(r.ClientCPU), us(base.ClientCPU)), us(r.ClientCPU), us(base.ClientCPU))
		if r.ServerCPU < 0 || base.ServerCPU < 0 {
			cpu.Unmeasured = true
			cpu.Figure = "the server's processes are not readable here; for information, " + client
		} else {
			sr := ratio(us(r.ServerCPU), us(base.ServerCPU))
			rt, bt := r.ClientCPU+r.ServerCPU, base.ClientCPU+base.ServerCPU
			cpu.Figure = fmt.Sprintf("%.2f (%.0f vs %.0f µs); for information, %s, client+server %.2f (%.0f vs %.0f µs)",
				sr, us(r.ServerCPU), us(base.ServerCPU), client, ratio(us(rt), us(bt)), us(rt), us(bt))
			cpu.Met = sr <= targetCPU
		}
		costs = append(costs, cpu)
		cr := ratio(us(r.ClientCPU), us(base.ClientCPU))
		costs = append(costs, target{
			Name:   fmt.Sprintf("client CPU per request: %s / baseline <= %.1f at concurrency %d", w.label, targetClient, ref.Concurrency),
			Figure: fmt.Sprintf("%.2f (%.0f vs %.0f µs)", cr, us(r.ClientCPU), us(base.ClientCPU)),
			Met:    cr <= targetClient,
		})
	}
	if replay, br := ref.workload("replay"), ref.workload("baseline-replay"); replay != nil && br != nil {
		r := ratio(replay.Throughput(), br.Throughput())
		through = append(through, target{
			Name:   fmt.Sprintf("replay / baseline replay throughput >= %.2f at concurrency %d", targetReplayB, ref.Concurrency),
			Figure: fmt.Sprintf("%.2f (%s vs %s/s)", r, rate(replay), rate(br)),
			Met:    r >= targetReplayB,
		})
	}
	if replay, sel := ref.workload("replay"), ref.workload("select"); replay != nil && sel != nil {
		r := ratio(replay.Throughput(), sel.Throughput())
		through = append(through, target{
			Name:   fmt.Sprintf("replay / primary-key SELECT throughput >= %.2f at concurrency %d", targetReplay, ref.Concurrency),
			Figure: fmt.Sprintf("%.2f (%s vs %s/s)", r, rate(replay), rate(sel)),
			Met:    r >= targetReplay,
		})
	}
	return append(through, costs...)
}

func renderReport(res *results) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	o := res.Opts

	dur := durability(res.Server.Settings)
	p("# idembench: %s\n\n", dur.short)
	p("**Commits: %s.** %s\n\n", dur.short, dur.long)
	p("- run: %s, took %s%s\n", res.Started.UTC().Format(time.RFC3339), res.Took.Round(time.Second), map[bool]string{true: " (-quick)", false: ""}[o.Quick])
	p("- machine: %s, %d cores, GOMAXPROCS %d, %s/%s, %s\n", res.Server.CPU, res.Server.Cores, runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, res.Server.Go)
	p("- load average (1, 5, 15 min): before %s, after %s\n", res.LoadBefore, res.LoadAfter)
	p("- Postgres %s (%s), %s\n", res.Server.Version, res.Source, res.Where)
	var settings []string
	for _, kv := range res.Server.Settings {
		settings = append(settings, kv[0]+"="+kv[1])
	}
	p("- settings: %s\n", strings.Join(settings, ", "))
	p("- method: closed loop, each worker sends its next request when the last answers; %s measured per workload and point in %d round(s) of alternating order, after %s of warm-up per round; latency is the whole call as the client sees it\n\n",
		o.Duration, o.Rounds, o.Warmup)

	var targets []target
	ref := refPoint(res.Load, o.ReferenceAt)
	if len(res.Load) > 0 && len(o.Workloads) < len(allWorkloads) {
		// A partial run (profiling one workload): its figures, no verdicts.
		p("## Load (only %s)\n\n", strings.Join(slices.Sorted(maps.Keys(o.Workloads)), ", "))
		p("| workload | concurrency | per second | p50 | p99 | WAL B/req | CPU µs/req, client / server |\n|---|---:|---:|---:|---:|---:|---:|\n")
		for _, lp := range res.Load {
			for _, w := range allWorkloads {
				if s := lp.workload(w); s != nil {
					p("| %s | %d | %s | %s | %s | %.0f | %s |\n", w, lp.Concurrency, rate(s), ms(s.P50), ms(s.P99), s.WALPerOp, cpuCell(s))
				}
			}
		}
		p("\n")
		p("%s", partialRatios(res.Load))
		res = &results{Opts: o, RoundTrips: res.RoundTrips, Storm: res.Storm, Scale: res.Scale, Profile: res.Profile, Citus: res.Citus, Server: res.Server}
		ref = nil
	}

	if len(res.Load) > 0 {
		flows := workloadsOf(kindFlow)
		p("## 1. Framework overhead\n\n")
		p("A new key per request through three steps (insert a ride; a foreign call with no latency, then record the charge; enqueue a job and respond 201). ")
		p("*runner* commits the key on its own, then each step (four commits); *receipt joined* and *all joined* join steps (`Phase.JoinPrevious`: three commits, two). ")
		p("*baseline* is the hand-rolled implementation with the runner's round trips and transactions (BEGIN rides with the first statement, COMMIT with the recovery-point update); ")
		p("*single tx* is the shape of a single-phase idempotency library: the key claimed in one transaction, then all three statements, the stored response and the key's finish in a second one (pipelined alike: three round trips, two commits); ")
		p("*plain tx* is the baseline's code with pgx's ordinary BEGIN / statement / update / COMMIT.\n\n")
		// Throughput, with every runner flow against every other flow.
		var ratios [][2]*workload
		for i := range flows {
			if !flows[i].runner {
				continue
			}
			for j := range flows {
				if !flows[j].runner {
					ratios = append(ratios, [2]*workload{&flows[i], &flows[j]})
				}
			}
		}
		var through, latency []column
		for _, w := range flows {
			through = append(through, column{w.label + " req/s", func(lp *loadPoint) string { return rate(lp.workload(w.name)) }})
			latency = append(latency,
				column{w.label + " p50", func(lp *loadPoint) string { return ms(lp.workload(w.name).P50) }},
				column{"p99", func(lp *loadPoint) string { return ms(lp.workload(w.name).P99) }})
		}
		for _, r := range ratios {
			through = append(through, column{r[0].label + " / " + r[1].label, func(lp *loadPoint) string {
				return fmt.Sprintf("**%.2f**", ratio(lp.workload(r[0].name).Throughput(), lp.workload(r[1].name).Throughput()))
			}})
		}
		p("%s\nLatency, the whole call as the client sees it:\n\n%s\n", pointTable(res.Load, through), pointTable(res.Load, latency))
		p("What the server wrote per request (WAL bytes, from `pg_current_wal_lsn()` around each run, warm-up included; background writers count too):\n\n")
		p("%s\n", pointTable(res.Load, workloadColumns(func(s *stats) string { return fmt.Sprintf("%.0f", s.WALPerOp) })))
		p("CPU time per request, this process / the server backends serving the pool (µs, from getrusage and /proc, warm-up included). The client and Postgres share the %d cores, so this is what throughput is made of:\n\n", res.Server.Cores)
		p("%s\n", pointTable(res.Load, workloadColumns(cpuCell)))
		if ref != nil {
			targets = append(targets, loadTargets(ref)...)
		}
	}

	if rt := res.RoundTrips; rt != nil {
		p("## 2. Round trips per request\n\n")
		p("One traced connection with a warm statement cache. *round trips* are flushed socket writes; *traced* counts what pgx's QueryTracer and BatchTracer saw (a query or a batch each); *transactions* are BEGIN ... COMMIT blocks plus statements sent outside one (each commits on its own).\n\n")
		p("| implementation | path | round trips | traced | statements | transactions | prepares | acquisition | per phase: round trips (own statements) |\n")
		p("|---|---|---:|---:|---:|---:|---:|---:|---|\n")
		acquireOK, phasesOK := true, true
		var worstPhase int64
		for _, pt := range rt.Paths {
			acq, phases := "", ""
			if pt.Impl == "runner" {
				acq = fmt.Sprint(pt.Acquisition)
				if pt.Acquisition != 1 {
					acquireOK = false
				}
			}
			var parts []string
			for _, ph := range pt.Phases {
				parts = append(parts, fmt.Sprintf("%s %d (%d)", ph.Phase, ph.RoundTrips, ph.Own))
				worstPhase = max(worstPhase, ph.RoundTrips-ph.Own)
				if ph.RoundTrips-ph.Own > 1 {
					phasesOK = false
				}
			}
			phases = strings.Join(parts, ", ")
			p("| %s | %s | %d | %d | %d | %d | %d | %s | %s |\n", pt.Impl, pt.Path, pt.Writes, pt.Traced, pt.Statements, pt.Transactions, pt.Prepares, acq, phases)
		}
		p("\n")
		var acqFig []string
		for _, pt := range rt.Paths {
			if pt.Impl == "runner" {
				acqFig = append(acqFig, fmt.Sprintf("%s %d", pt.Path, pt.Acquisition))
			}
		}
		targets = append(targets,
			target{Name: "acquisition is one round trip (new key, replay, in progress)", Figure: strings.Join(acqFig, ", "), Met: acquireOK},
			target{Name: "at most one round trip per phase beyond its own statements", Figure: fmt.Sprintf("at most %d", worstPhase), Met: phasesOK})
	}

	if len(res.Load) > 0 {
		p("## 3. Replay path\n\n")
		p("Runner replays of finished keys (acquisition, mismatch check, the stored response decoded), against `SELECT response_status, response_headers, response_body FROM idem_keys WHERE id = $1` on the same pool, both over the same %d keys.\n\n", o.ReplayKeys)
		var cols []column
		for _, w := range []struct{ name, head string }{{"replay", "replays/s"}, {"select", "plain SELECT/s"}} {
			cols = append(cols, column{w.head, func(lp *loadPoint) string { return rate(lp.workload(w.name)) }},
				column{"p50", func(lp *loadPoint) string { return ms(lp.workload(w.name).P50) }},
				column{"p99", func(lp *loadPoint) string { return ms(lp.workload(w.name).P99) }})
		}
		cols = append(cols, column{"replay / SELECT", func(lp *loadPoint) string {
			return fmt.Sprintf("**%.2f**", ratio(lp.workload("replay").Throughput(), lp.workload("select").Throughput()))
		}})
		p("%s\n", pointTable(res.Load, cols))
	}

	if s := res.Storm; s != nil {
		p("## 4. Duplicate storm\n\n")
		p("%d identical requests released at once, %d rounds (after one unmeasured warm-up round, also checked), a new key each round. Exact: one executed outcome, each phase committed once (observer events), one ride row and one job row.\n\n", s.Size, s.Rounds)
		var kinds []string
		for k := range s.Outcomes {
			kinds = append(kinds, string(k))
		}
		slices.Sort(kinds)
		var outcomes []string
		for _, k := range kinds {
			outcomes = append(outcomes, fmt.Sprintf("%s %d", k, s.Outcomes[idem.OutcomeKind(k)]))
		}
		p("| rounds exact | outcomes | winner p50 | winner p99 | loser p50 | loser p99 |\n")
		p("|---:|---|---:|---:|---:|---:|\n")
		p("| %d / %d | %s | %s | %s | %s | %s |\n\n", s.Exact, s.Rounds, strings.Join(outcomes, ", "),
			ms(s.Winners.P50), ms(s.Winners.P99), ms(s.Losers.P50), ms(s.Losers.P99))
		for _, pr := range s.Problems {
			p("- %s\n", pr)
		}
		targets = append(targets, target{
			Name:   "duplicate storm: exactly one execution every round",
			Figure: fmt.Sprintf("%d of %d rounds; loser p99 %s", s.Exact, s.Rounds, ms(s.Losers.P99)),
			Met:    s.Exact == s.Rounds && len(s.Problems) == 0,
		})
	}

	if len(res.Load) > 0 {
		p("## 5. Commit ceiling\n\n")
		flows := workloadsOf(kindFlow)
		var per []string
		for _, w := range flows {
			per = append(per, fmt.Sprintf("%s %d", w.label, w.commits))
		}
		p("The database's own rate of `INSERT INTO commit_probe ... VALUES ($1, $2)` in autocommit, one round trip and one commit each, at the same concurrency, against each flow's commits per second. Commits per request: %s (the key's insert, then the runner's transactions).\n\n", strings.Join(per, ", "))
		cols := []column{
			{"INSERT+commit/s", func(lp *loadPoint) string { return rate(lp.workload("commit")) }},
			{"p50", func(lp *loadPoint) string { return ms(lp.workload("commit").P50) }},
			{"p99", func(lp *loadPoint) string { return ms(lp.workload("commit").P99) }},
		}
		commitsOf := func(lp *loadPoint, w workload) float64 { return lp.workload(w.name).Throughput() * float64(w.commits) }
		for _, w := range flows {
			cols = append(cols, column{w.label + " commits/s", func(lp *loadPoint) string { return fmt.Sprintf("%.0f", commitsOf(lp, w)) }},
				column{"share", func(lp *loadPoint) string {
					return fmt.Sprintf("%.0f%%", 100*ratio(commitsOf(lp, w), lp.workload("commit").Throughput()))
				}})
		}
		p("%s\n", pointTable(res.Load, cols))
	}

	if sc := res.Scale; sc != nil && len(sc.Points) == 3 {
		p("## 6. Scale\n\n")
		p("`Store.Acquire` alone (the one acquisition statement), %d workers: half acquire new keys (an insert into the table and its indexes), half replay a random sample of unexpired finished keys spread over the whole table. ", sc.Config.Concurrency)
		p("Generated keys are finished, with log-uniform scopes over a million users, random UUID keys and realistic response and checkpoint sizes. The large table was grown from the small one; the reaper then deletes its %s expired keys (`Runner.Reap`, default batches of 1000) while acquisitions run.\n\n", humanCount(sc.Config.Expired))
		prewarm := "with `pg_prewarm` (indexes first, unique ones first: 'buffer' into shared_buffers while they fit in three quarters of it, 'read' into the operating system's page cache for the rest)"
		if sc.NoPrewarm != "" {
			prewarm = fmt.Sprintf("with SELECTs that read every page (a sequential scan of the heap, a full scan of each index), because `pg_prewarm` is not available here: %s", sc.NoPrewarm)
		}
		p("Every point is measured in steady state. Before it, the table and its indexes are prewarmed %s; then the same workload runs in windows of %s until its throughput stops rising (a window not more than %.0f%% above the best before it, %d windows in a row; at most %d windows), and only then is the point measured for %s. ",
			prewarm, sc.Config.Steady.Window, 100*steadyRise, steadyCalm, sc.Config.Steady.MaxWindows, sc.Config.Duration)
		p("The reaping point warms up the same way without the reaper, then starts it and measures while it runs. The warm-up's new keys stay in the table, so rows are counted when the measurement starts.\n\n")
		p("| table | rows when measured | new key p50 | new key p99 | replay p50 | replay p99 | acquisitions/s | notes |\n")
		p("|---|---:|---:|---:|---:|---:|---:|---|\n")
		for i, pt := range sc.Points {
			note := ""
			switch i {
			case 0, 1:
				note = "generated in " + shortDuration(pt.Took)
			case 2:
				note = fmt.Sprintf("reaper deleted %d keys in %d batches in %s (%.0f keys/s)", pt.Reaped, pt.Batches,
					shortDuration(pt.ReapTook), float64(pt.Reaped)/pt.ReapTook.Seconds())
			}
			p("| %s | %d | %s | %s | %s | %s | %.0f | %s |\n", pt.Label, pt.Rows, ms(pt.New.P50), ms(pt.New.P99),
				ms(pt.Replay.P50), ms(pt.Replay.P99), pt.New.Throughput()+pt.Replay.Throughput(), note)
		}
		p("\nWarm-up before each point (acquisitions/s of each window):\n\n")
		p("| table | prewarm | windows | acquisitions/s per window |\n|---|---|---|---|\n")
		for _, pt := range sc.Points {
			w := pt.Warmup
			state := "steady"
			if !w.Steady {
				state = "**not steady**, measured anyway"
			}
			p("| %s | %s: %s | %d in %s, %s | %s |\n", pt.Label, shortDuration(w.PrewarmTook), w.Prewarm,
				len(w.Windows), shortDuration(w.Took), state, windowsText(w.Windows))
		}
		p("\nLarge table on disk: %s. Growing it: %s.\n\n", sc.TableSize, strings.Join(sc.GenSteps, "; "))
		small, large, reap := sc.Points[0], sc.Points[1], sc.Points[2]
		rn, rr := ratioD(large.New.P99, small.New.P99), ratioD(large.Replay.P99, small.Replay.P99)
		targets = append(targets, target{
			Name: fmt.Sprintf("acquisition p99 at %s within %.1fx of %s", humanCount(sc.Config.Large), targetScale, humanCount(sc.Config.Small)),
			Figure: fmt.Sprintf("new key %.2fx (%s vs %s), replay %.2fx (%s vs %s)", rn, ms(large.New.P99), ms(small.New.P99),
				rr, ms(large.Replay.P99), ms(small.Replay.P99)),
			Met: rn <= targetScale && rr <= targetScale,
		})
		dn, dr := ratioD(reap.New.P99, large.New.P99), ratioD(reap.Replay.P99, large.Replay.P99)
		complete := reap.Reaped == sc.Config.Expired
		fig := fmt.Sprintf("new key %.2fx (%s vs %s), replay %.2fx (%s vs %s)", dn, ms(reap.New.P99), ms(large.New.P99),
			dr, ms(reap.Replay.P99), ms(large.Replay.P99))
		if !complete {
			fig += fmt.Sprintf("; the reaper deleted only %d of %d", reap.Reaped, sc.Config.Expired)
		}
		targets = append(targets, target{
			Name:   fmt.Sprintf("acquisition p99 while reaping within %.0fx of without", targetReaping),
			Figure: fig,
			Met:    dn <= targetReaping && dr <= targetReaping && complete,
		})
	}

	if pr := res.Profile; pr != nil {
		p("%s", renderProfile(pr))
	}
	if res.Citus != nil {
		p("%s", renderCitus(res.Citus, res.Server.Cores))
	}

	if len(targets) > 0 {
		p("## Targets\n\n")
		switch {
		case len(res.Load) > 0 && ref != nil:
			p("Throughput, WAL and CPU targets are judged at concurrency %d, with %s.\n\n", ref.Concurrency, dur.short)
		case len(res.Load) > 0:
			p("The throughput, WAL and CPU targets are judged at concurrency %d, which this run did not measure.\n\n", o.ReferenceAt)
		}
		p("| target | figure | result |\n|---|---|---|\n")
		for _, t := range targets {
			verdict := "**missed**"
			switch {
			case t.Unmeasured:
				verdict = "not measured"
			case t.Met:
				verdict = "met"
			}
			p("| %s | %s | %s |\n", t.Name, t.Figure, verdict)
		}
		p("\n")
	}
	return b.String()
}

// workloadsOf returns the workloads of one kind, in order.
func workloadsOf(kind workloadKind) []workload {
	var out []workload
	for _, w := range workloads {
		if w.kind == kind {
			out = append(out, w)
		}
	}
	return out
}

// column is one column of a pointTable: its heading, and its cell at a
// load point.
type column struct {
	head string
	cell func(*loadPoint) string
}

// pointTable is a table with a row per load point: its concurrency, then
// each column's cell, all right-aligned.
func pointTable(points []*loadPoint, cols []column) string {
	var b strings.Builder
	b.WriteString("| concurrency |")
	for _, c := range cols {
		b.WriteString(" " + c.head + " |")
	}
	b.WriteString("\n|---:|" + strings.Repeat("---:|", len(cols)) + "\n")
	for _, lp := range points {
		fmt.Fprintf(&b, "| %d |", lp.Concurrency)
		for _, c := range cols {
			b.WriteString(" " + c.cell(lp) + " |")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// workloadColumns are one figure of every workload.
func workloadColumns(cell func(*stats) string) []column {
	var cols []column
	for _, w := range workloads {
		cols = append(cols, column{w.label, func(lp *loadPoint) string { return cell(lp.workload(w.name)) }})
	}
	return cols
}

// durabilityInfo says in words how the measured server commits.
type durabilityInfo struct {
	short string // for the heading: "durable commits", "fsync off", ...
	long  string // what that means for the figures
}

// durability reads fsync, synchronous_commit and full_page_writes from the
// server's settings.
func durability(settings [][2]string) durabilityInfo {
	set := map[string]string{}
	for _, kv := range settings {
		set[kv[0]] = kv[1]
	}
	fsync, sc, fpw := set["fsync"], set["synchronous_commit"], set["full_page_writes"]
	these := fmt.Sprintf("fsync=%s, synchronous_commit=%s, full_page_writes=%s", fsync, sc, fpw)
	switch {
	case fsync == "" || sc == "" || fpw == "":
		return durabilityInfo{"commits of unknown durability", "The server's fsync, synchronous_commit and full_page_writes could not be read."}
	case fsync != "on":
		return durabilityInfo{"fsync off", "The server runs with " + these + ": commits do not wait for the disk and a crash can lose or corrupt data, " +
			"so commit-bound figures are CPU figures, not disk figures (pgtest's throwaway defaults; -durable runs with durable commits)."}
	case sc == "off":
		return durabilityInfo{"asynchronous commits", "The server runs with " + these + ": a commit returns before its WAL reaches the disk, " +
			"so a crash can lose the last commits (but not corrupt data); commit-bound figures are mostly CPU figures."}
	case fpw != "on":
		return durabilityInfo{"durable commits, full_page_writes off", "The server runs with " + these + ": every commit waits for its WAL to reach the disk, " +
			"but without full-page images a torn page after a crash is not repaired."}
	}
	return durabilityInfo{"durable commits", "The server runs with " + these + ": every commit waits for its WAL to be flushed to the disk, " +
		"so commit-bound figures include the disk's flush latency."}
}

// refPoint is the load point at the reference concurrency, or nil.
func refPoint(points []*loadPoint, c int) *loadPoint {
	for _, lp := range points {
		if lp.Concurrency == c {
			return lp
		}
	}
	return nil
}

func rate(s *stats) string {
	if s == nil {
		return "-"
	}
	return fmt.Sprintf("%.0f", s.Throughput())
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

// micros is d in whole microseconds, "-" when negative (not measured).
func micros(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", float64(d)/float64(time.Microsecond))
}

// cpuCell is "client / server" CPU per operation in microseconds.
func cpuCell(s *stats) string { return micros(s.ClientCPU) + " / " + micros(s.ServerCPU) }

func ratioD(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// renderProfile is the profile section: CPU and wall time per round trip.
func renderProfile(pr *profileReport) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("## 7. Where the time goes\n\n")
	p("One request at a time on one connection (a pool of one, warm statement cache), each path %d times after %d unmeasured requests, twice. ", pr.N, pr.Warmup)
	p("The traced pass reads the connection's backend's `/proc/<pid>/schedstat` (nanoseconds on the CPU, kept by the scheduler) when pgx's QueryTracer or BatchTracer starts and ends each query or batch: the difference is what that round trip cost the server. ")
	p("A batch is one row, named after its statements; the runner's rows are named after the phase they ran in (the test hook's phase start and commit). ")
	p("*between* is the backend's CPU in the traced pass outside every round trip's window (work it did after answering). ")
	p("The totals come from the untraced pass: the backend's schedstat around the whole pass, this process's getrusage (client CPU, per request only: the process's threads are not told apart), and wall time, each divided by %d. ", pr.N)
	p("With nothing else running, these are costs, not throughput: the load section's figures under concurrency add contention and scheduling.\n\n")
	if !pr.Measured {
		p("Server CPU is not measured: %s.\n\n", pr.Why)
	}
	p("| path | round trip | per request | server CPU µs | wall µs |\n|---|---|---:|---:|---:|\n")
	for _, pp := range pr.Paths {
		for _, r := range pp.Rows {
			p("| %s | %s | %.3g | %s | %s |\n", pp.Name, r.Label, r.PerRequest, micros(r.Server), micros(r.Wall))
		}
		if pp.Between >= 0 {
			p("| %s | *between round trips* | | %s | |\n", pp.Name, micros(pp.Between))
		}
	}
	p("\nPer request (untraced pass):\n\n")
	p("| path | server CPU µs | client CPU µs | wall µs |\n|---|---:|---:|---:|\n")
	for _, pp := range pr.Paths {
		p("| %s | %s | %s | %s |\n", pp.Name, micros(pp.Server), micros(pp.Client), micros(pp.Wall))
	}
	p("\n")
	return b.String()
}

// partialRatios are the ratios a partial run can still give: the runner
// against the baseline and the replay against the baseline's replay, for
// whichever of those pairs the run measured (throughput, WAL, client and
// server CPU per request), so that a change can be measured on those four
// workloads alone, interleaved in one run.
func partialRatios(points []*loadPoint) string {
	var b strings.Builder
	for _, lp := range points {
		for _, pair := range [][2]string{{"runner", "baseline"}, {"replay", "baseline-replay"}} {
			a, base := lp.workload(pair[0]), lp.workload(pair[1])
			if a == nil || base == nil {
				continue
			}
			server := "-"
			if a.ServerCPU >= 0 && base.ServerCPU > 0 {
				server = fmt.Sprintf("%.2f", ratioD(a.ServerCPU, base.ServerCPU))
			}
			fmt.Fprintf(&b, "- %s / %s at concurrency %d: throughput %.2f, WAL per request %.2f, client CPU %.2f, server CPU %s\n",
				pair[0], pair[1], lp.Concurrency, ratio(a.Throughput(), base.Throughput()), ratio(a.WALPerOp, base.WALPerOp),
				ratioD(a.ClientCPU, base.ClientCPU), server)
		}
	}
	if b.Len() > 0 {
		b.WriteString("\n")
	}
	return b.String()
}
