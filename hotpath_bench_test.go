package idem

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
)

// Benchmarks of the runner's in-process work per request, the part that is
// not a database round trip: preparing the input, the bookkeeping of a
// three-phase run, and building a replayed outcome. cmd/idembench measures
// the whole request against Postgres; these say what the Go side costs.

type benchRideInput struct {
	UserID int64  `json:"user_id"`
	Origin string `json:"origin"`
	Amount int64  `json:"amount"`
}

func benchFlow(tb testing.TB) *Flow[benchRideInput] {
	tb.Helper()
	advance := func(context.Context, Tx, *Attempt[benchRideInput]) (Result, error) { return Advance(), nil }
	f, err := NewFlow("bench.rides", []Phase[benchRideInput]{
		{Name: "ride_created", Do: advance},
		{Name: "charge_created", Do: advance},
		{Name: "receipt_enqueued", Do: advance},
	}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return f
}

func benchFinishedRecord() *idemtype.KeyRecord {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	return &idemtype.KeyRecord{
		ID: 42, Scope: "user:7", Key: "8e0c2a5e-5f0b-4a44-9d57-3c6f3c2b1a90",
		Flow: "bench.rides", Method: "POST", Path: "/rides", Fingerprint: make([]byte, 32),
		Params: json.RawMessage(`{"user_id":7,"origin":"SF","amount":2000}`),
		Status: idemtype.StoredFinished, RecoveryPoint: idemtype.RecoveryPointFinished,
		Checkpoint: map[string]json.RawMessage{"ride_id": json.RawMessage(`123`), "charge_id": json.RawMessage(`"ch_idem-0b9f-charge_created"`)},
		Fence:      1, ResponseStatus: http.StatusCreated,
		ResponseHeaders: http.Header{"Content-Type": {"application/json"}, "X-Ride": {"123"}},
		ResponseBody:    []byte(`{"ride_id":123,"charge_id":"ch_idem-0b9f1f5e-7d5c-4e43-9a53-2f1f6c2f0a11-charge_created","amount":2000}`),
		Attempts:        1, CreatedAt: now, LastRunAt: now, FinishedAt: &now, ExpiresAt: &now,
	}
}

// BenchmarkPrepareParams is what every request pays before its one
// acquisition statement: decode (for JSON), encode and fingerprint the input.
func BenchmarkPrepareParams(b *testing.B) {
	f := benchFlow(b)
	in := benchRideInput{UserID: 7, Origin: "SF", Amount: 2000}
	b.Run("Value", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := f.prepare(&Request{Params: in}, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("JSON", func(b *testing.B) {
		body := []byte(`{"origin": "SF", "amount": 2000, "user_id": 7}`)
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if _, err := f.prepare(&Request{Params: body}, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkReplayOutcome is the runner's work on a replay once the
// acquisition statement has returned the finished row: the mismatch check
// and the outcome with its copy of the stored response.
func BenchmarkReplayOutcome(b *testing.B) {
	rec := benchFinishedRecord()
	fp := make([]byte, 32)
	b.ReportAllocs()
	for b.Loop() {
		if rec.Flow != "bench.rides" || string(rec.Fingerprint) != string(fp) {
			b.Fatal("mismatch")
		}
		out := &Outcome{Kind: OutcomeReplayed, Response: rec.Response(), Record: rec}
		if out.Response.Status != http.StatusCreated {
			b.Fatal(out.Response.Status)
		}
	}
}

// BenchmarkStorableResponse is the header filtering every responding
// phase does before its response is stored.
func BenchmarkStorableResponse(b *testing.B) {
	resp := &idemtype.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "X-Ride": {"123"}, "Set-Cookie": {"session=1"}, "Date": {"Mon, 02 Jan 2026 03:04:05 GMT"}},
		Body:   benchFinishedRecord().ResponseBody,
	}
	b.ReportAllocs()
	for b.Loop() {
		if out := storableResponse(resp); len(out.Header) != 2 {
			b.Fatal(out.Header)
		}
	}
}

// BenchmarkHeldBookkeeping is the in-memory bookkeeping of one
// three-phase request, without the database: each phase begins an attempt,
// reads its key (a copy) and a checkpoint, records one, derives the
// downstream key, and has its commit applied to the in-memory record.
func BenchmarkHeldBookkeeping(b *testing.B) {
	f := benchFlow(b)
	r := &Runner{config: (&Config{}).WithDefaults()}
	in := benchRideInput{UserID: 7, Origin: "SF", Amount: 2000}
	names := f.PhaseNames()
	b.ReportAllocs()
	for b.Loop() {
		rec := benchFinishedRecord()
		rec.Status, rec.RecoveryPoint, rec.Checkpoint = idemtype.StoredRunning, idemtype.RecoveryPointStarted, map[string]json.RawMessage{}
		h := r.hold(f, rec, in, false, time.Now())
		for i, name := range names {
			h.enterPhase(i)
			h.beginAttempt()
			run := &Attempt[benchRideInput]{h: h, input: in}
			if run.Key().ID != 42 {
				b.Fatal("key")
			}
			var rideID int64
			if _, err := run.Checkpoint("ride_id", &rideID); err != nil {
				b.Fatal(err)
			}
			if err := run.SetCheckpoint(name, int64(i)); err != nil {
				b.Fatal(err)
			}
			_ = run.IdempotencyKey()
			h.committed(&idemdriver.CommitParams{Ref: h.ref, RecoveryPoint: name, Status: idemtype.StoredRunning, CheckpointPatch: h.patch})
		}
	}
}
