package simulate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/go-idem/idem/examples/rides/fakepay"
	"github.com/go-idem/idem/examples/rides/internal/ridesapp"
	"github.com/go-idem/idem/migrations"
)

// Report is what a simulation observed and what its audit found. Its
// summary (WriteSummary) prints one "name: number" line per field, in this
// order; the names are part of the interface, scripts and tests parse them.
type Report struct {
	// Traffic, as the clients saw it.
	Requests         int // ride requests, each with its own key
	Attempts         int // HTTP requests sent, duplicates and retries included
	Retries          int // attempts after a sender's first
	Duplicates       int // requests sent twice at once
	Replays          int // answers marked Idempotent-Replayed
	Conflicts        int // 409s: the key was held by another attempt
	ServerErrors     int // 5xx answers (retried)
	ClientTimeouts   int // attempts the client gave up on (retried)
	ConnectionErrors int // attempts without an answer: refused, reset, dropped (retried)
	Succeeded        int // requests whose final status was 201
	Declined         int // requests whose final status was 402

	// Invariants about the answers. Each must be 0.
	Unexpected  int // requests that ended in another status, or the wrong one for their user
	Unfinished  int // requests with no final status when the run's deadline came
	Mismatches  int // final answers that differ from the first (duplicate senders, the final replay)
	Disagreeing int // final answers that disagree with the database (ride, charge, status)

	// The audit of the database and the ledger.
	Rides              int // rides this run created
	ChargesInLedger    int // ledger charges for this run's rides, or for no ride at all
	DoubleCharges      int // ledger charges for a ride that already has another charge
	RidesWithoutCharge int // rides neither declined nor charged by a charge that is in the ledger
	ChargesWithoutRide int // ledger charges recorded on no ride
	ReceiptsMissing    int // this run's charged rides without a receipt
	StuckKeys          int // this run's idempotency keys not finished

	// Speed.
	P50LatencyMS float64 // median attempt latency
	P99LatencyMS float64
	Throughput   float64 // finished requests per second of traffic
}

// Violations returns the names of the invariants that do not hold.
func (r *Report) Violations() []string {
	var out []string
	for _, l := range r.lines() {
		if l.invariant && l.value != 0 {
			out = append(out, l.name)
		}
	}
	return out
}

// OK reports whether every invariant holds.
func (r *Report) OK() bool { return len(r.Violations()) == 0 }

type line struct {
	name      string
	value     float64
	format    string
	invariant bool
}

func (r *Report) lines() []line {
	n := func(name string, v int) line { return line{name: name, value: float64(v), format: "%.0f"} }
	inv := func(name string, v int) line {
		return line{name: name, value: float64(v), format: "%.0f", invariant: true}
	}
	return []line{
		n("requests", r.Requests),
		n("attempts", r.Attempts),
		n("retries", r.Retries),
		n("duplicates", r.Duplicates),
		n("replays", r.Replays),
		n("conflicts (409)", r.Conflicts),
		n("server errors (5xx)", r.ServerErrors),
		n("client timeouts", r.ClientTimeouts),
		n("connection errors", r.ConnectionErrors),
		n("succeeded (201)", r.Succeeded),
		n("declined (402)", r.Declined),
		inv("unexpected answers", r.Unexpected),
		inv("unfinished requests", r.Unfinished),
		inv("replay mismatches", r.Mismatches),
		inv("answers disagreeing with database", r.Disagreeing),
		n("rides", r.Rides),
		n("charges in ledger", r.ChargesInLedger),
		inv("double charges", r.DoubleCharges),
		inv("rides without charge", r.RidesWithoutCharge),
		inv("charges without ride", r.ChargesWithoutRide),
		inv("receipts missing", r.ReceiptsMissing),
		inv("stuck keys", r.StuckKeys),
		{name: "p50 latency ms", value: r.P50LatencyMS, format: "%.1f"},
		{name: "p99 latency ms", value: r.P99LatencyMS, format: "%.1f"},
		{name: "throughput req/s", value: r.Throughput, format: "%.1f"},
	}
}

// SummaryLine is an extra "name: number" line for WriteSummary, from the
// program that ran the simulation (the demo's server kills, say).
type SummaryLine struct {
	Name  string
	Value int
	// Invariant lines count as violations when Value is not 0.
	Invariant bool
}

// WriteSummary prints extra, then the report, one "name: number" line each,
// and ends with "invariants violated: N", counting the report's violations
// and the extra invariant lines that are not 0.
func (r *Report) WriteSummary(w io.Writer, extra ...SummaryLine) error {
	var b bytes.Buffer
	violated := len(r.Violations())
	for _, l := range extra {
		fmt.Fprintf(&b, "%s: %d\n", l.Name, l.Value)
		if l.Invariant && l.Value != 0 {
			violated++
		}
	}
	for _, l := range r.lines() {
		fmt.Fprintf(&b, "%s: "+l.format+"\n", l.name, l.value)
	}
	fmt.Fprintf(&b, "invariants violated: %d\n", violated)
	_, err := w.Write(b.Bytes())
	return err
}

// tally turns the senders' records into the traffic half of the report.
func (s *simulator) tally(requests []*request, trafficEnded time.Time) *Report {
	st := &s.stats
	r := &Report{
		Requests:         len(requests),
		Attempts:         int(st.attempts.Load()),
		Duplicates:       int(st.duplicates.Load()),
		Replays:          int(st.replays.Load()),
		Conflicts:        int(st.conflicts.Load()),
		ServerErrors:     int(st.serverErrors.Load()),
		ClientTimeouts:   int(st.clientTimeouts.Load()),
		ConnectionErrors: int(st.connectionErrors.Load()),
	}
	// Every sender's first attempt is not a retry: one per request, one more
	// per duplicate.
	r.Retries = r.Attempts - r.Requests - r.Duplicates
	finished := 0
	for _, q := range requests {
		q.mu.Lock()
		r.Mismatches += q.disagreements
		switch {
		case !q.finished:
			r.Unfinished++
		case q.status == http.StatusCreated && !q.declined:
			r.Succeeded++
		case q.status == http.StatusPaymentRequired && q.declined:
			r.Declined++
		default:
			r.Unexpected++
			s.cfg.Logger.Warn("simulate: unexpected answer", "key", q.key, "user", q.email, "status", q.status, "body", string(q.response))
		}
		if q.finished {
			finished++
		}
		q.mu.Unlock()
	}
	if elapsed := trafficEnded.Sub(s.started).Seconds(); elapsed > 0 {
		r.Throughput = float64(finished) / elapsed
	}
	st.mu.Lock()
	lat := slices.Clone(st.latencies)
	st.mu.Unlock()
	slices.Sort(lat)
	percentile := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		i := min(int(p*float64(len(lat))), len(lat)-1)
		return float64(lat[i].Microseconds()) / 1000
	}
	r.P50LatencyMS, r.P99LatencyMS = percentile(0.50), percentile(0.99)
	return r
}

// checkReplays sends every finished request once more, with its key and its
// body: the answer must be the stored one, byte for byte, marked as a
// replay.
func (s *simulator) checkReplays(ctx context.Context, requests []*request, r *Report) {
	var replayStats stats // kept apart: these attempts are not traffic
	sem := make(chan struct{}, s.cfg.Clients)
	done := make(chan int, len(requests))
	pending := 0
	for _, q := range requests {
		q.mu.Lock()
		finished, status, body := q.finished, q.status, q.response
		q.mu.Unlock()
		if !finished {
			continue
		}
		pending++
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			a := s.retryToFinal(ctx, q, &replayStats, true)
			if a.err != nil || a.status != status || !bytes.Equal(a.body, body) || !a.replayed {
				s.cfg.Logger.Warn("simulate: final retry did not replay the stored answer", "key", q.key,
					"status", status, "replay_status", a.status, "replayed", a.replayed, "err", a.err,
					"body", string(body), "replay_body", string(a.body))
				done <- 1
				return
			}
			done <- 0
		}()
	}
	for range pending {
		r.Mismatches += <-done
	}
}

// audit compares the database and the ledger with each other and with the
// answers. Background work (receipt jobs, a key abandoned by a killed server
// and finished by the completer) may still be settling when the traffic
// ends, so the audit polls until the database is quiet or deadline passes,
// then reports what it found.
func (s *simulator) audit(ctx context.Context, deadline time.Time, requests []*request, r *Report) error {
	prefix, err := migrations.QualifiedPrefix(s.cfg.Schema)
	if err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	waitStarted, lastLog := time.Now(), time.Now()
	for {
		stuck, missing, err := s.unsettled(ctx, prefix)
		if err != nil {
			return err
		}
		if (stuck == 0 && missing == 0) || time.Now().After(deadline) {
			if time.Since(waitStarted) > time.Second {
				s.cfg.Logger.Info("simulate: background work settled", "waited", time.Since(waitStarted).Round(time.Millisecond).String(),
					"stuck_keys", stuck, "receipts_missing", missing)
			}
			break
		}
		if time.Since(lastLog) > 5*time.Second {
			lastLog = time.Now()
			s.cfg.Logger.Info("simulate: waiting for the servers' background work", "stuck_keys", stuck, "receipts_missing", missing)
		}
		// Waiting on other processes (the servers' job workers and
		// maintenance), so polling is all there is.
		t := time.NewTimer(200 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("simulate: interrupted: %w", ctx.Err())
		case <-t.C:
		}
	}

	charges, err := s.cfg.Payments.ListCharges(ctx)
	if err != nil {
		return fmt.Errorf("simulate: audit: list the ledger: %w", err)
	}
	rides := map[int64]ride{}
	rows, err := s.cfg.Pool.Query(ctx, `SELECT r.id, r.payment_status, r.charge_id, r.charge_reference, k.key
		FROM `+prefix+`rides r LEFT JOIN `+prefix+`idem_keys k ON k.id = r.idempotency_key_id
		WHERE r.created_at >= $1`, s.since)
	if err != nil {
		return fmt.Errorf("simulate: audit: %w", err)
	}
	byKey := map[string]int64{}
	byReference := map[string]int64{}
	for rows.Next() {
		var id int64
		var rd ride
		var reference *string
		if err := rows.Scan(&id, &rd.status, &rd.chargeID, &reference, &rd.key); err != nil {
			rows.Close()
			return fmt.Errorf("simulate: audit: %w", err)
		}
		rides[id] = rd
		if rd.key != nil {
			byKey[*rd.key] = id
		}
		if reference != nil {
			byReference[*reference] = id
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("simulate: audit: %w", err)
	}
	stuck, missing, err := s.unsettled(ctx, prefix)
	if err != nil {
		return err
	}
	r.StuckKeys, r.ReceiptsMissing = stuck, missing
	r.Rides = len(rides)

	// Each ledger charge is this run's if it names one of this run's rides
	// (by the ride's charge reference). Of those, the one recorded on the
	// ride is its charge and any other is a double charge. A charge naming an
	// older ride (an earlier run against the same provider) is not this
	// run's business; a charge naming no ride at all is a charge without
	// ride.
	recorded := map[string]bool{}
	for _, rd := range rides {
		if rd.chargeID != nil {
			recorded[*rd.chargeID] = true
		}
	}
	older, err := s.olderRides(ctx, prefix, charges, byReference)
	if err != nil {
		return err
	}
	inLedger := map[string]bool{}
	for _, c := range charges {
		reference, named := ridesapp.ParseChargeDescription(c.Description)
		if named && older[reference] {
			continue
		}
		r.ChargesInLedger++
		inLedger[c.ID] = true
		if recorded[c.ID] {
			continue
		}
		rideID, found := byReference[reference]
		if rd := rides[rideID]; named && found && rd.chargeID != nil {
			r.DoubleCharges++
			s.cfg.Logger.Warn("simulate: double charge", "ride_id", rideID, "charge_id", c.ID, "recorded_charge_id", *rd.chargeID)
			continue
		}
		r.ChargesWithoutRide++
		s.cfg.Logger.Warn("simulate: charge without ride", "charge_id", c.ID, "description", c.Description)
	}
	for id, rd := range rides {
		if rd.status == "declined" {
			continue
		}
		if rd.chargeID == nil || !inLedger[*rd.chargeID] {
			r.RidesWithoutCharge++
			s.cfg.Logger.Warn("simulate: ride without charge", "ride_id", id, "payment_status", rd.status)
		}
	}

	// Each answer must describe what the database holds for its key.
	for _, q := range requests {
		q.mu.Lock()
		finished, status, body := q.finished, q.status, q.response
		q.mu.Unlock()
		if !finished {
			continue
		}
		rideID, ok := byKey[q.key]
		rd := rides[rideID]
		agree := ok
		switch status {
		case http.StatusCreated:
			var resp ridesapp.RideResponse
			agree = agree && json.Unmarshal(body, &resp) == nil && resp.RideID == rideID &&
				rd.status == "charged" && rd.chargeID != nil && *rd.chargeID == resp.ChargeID
		case http.StatusPaymentRequired:
			agree = agree && rd.status == "declined"
		}
		if !agree {
			r.Disagreeing++
			s.cfg.Logger.Warn("simulate: answer disagrees with the database", "key", q.key, "status", status, "body", string(body), "ride_id", rideID)
		}
	}
	return nil
}

// ride is a ride as the audit sees it.
type ride struct {
	status   string
	chargeID *string
	key      *string
}

// unsettled counts what the servers still owe for this run: keys not
// finished, and charged rides whose receipt is not recorded yet.
func (s *simulator) unsettled(ctx context.Context, prefix string) (stuckKeys, receiptsMissing int, err error) {
	err = s.cfg.Pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM `+prefix+`idem_keys WHERE status <> 'finished' AND created_at >= $1),
		(SELECT count(*) FROM `+prefix+`rides r WHERE r.payment_status = 'charged' AND r.created_at >= $1
		    AND NOT EXISTS (SELECT 1 FROM `+prefix+`receipts c WHERE c.ride_id = r.id))`, s.since).Scan(&stuckKeys, &receiptsMissing)
	if err != nil {
		return 0, 0, fmt.Errorf("simulate: audit: %w", err)
	}
	return stuckKeys, receiptsMissing, nil
}

// olderRides returns which of the charge references the ledger's charges
// name belong to rides that exist but predate this run.
func (s *simulator) olderRides(ctx context.Context, prefix string, charges []fakepay.Charge, ours map[string]int64) (map[string]bool, error) {
	var references []string
	for _, c := range charges {
		if reference, ok := ridesapp.ParseChargeDescription(c.Description); ok {
			if _, mine := ours[reference]; !mine {
				references = append(references, reference)
			}
		}
	}
	older := map[string]bool{}
	if len(references) == 0 {
		return older, nil
	}
	rows, err := s.cfg.Pool.Query(ctx, `SELECT DISTINCT charge_reference FROM `+prefix+`rides
		WHERE charge_reference = ANY($1) AND created_at < $2`, references, s.since)
	if err != nil {
		return nil, fmt.Errorf("simulate: audit: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var reference string
		if err := rows.Scan(&reference); err != nil {
			return nil, fmt.Errorf("simulate: audit: %w", err)
		}
		older[reference] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("simulate: audit: %w", err)
	}
	return older, nil
}
