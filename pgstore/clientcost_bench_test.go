package pgstore

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/idemtype"
)

// Benchmarks of the store's client-side work per phase, which idembench's
// client CPU figure is made of besides pgx and the socket: the
// transaction-control check of a phase's statement and the guarded
// commit's arguments.

const benchPhaseSQL = `INSERT INTO rides (user_id, origin, amount, idem_key_id) VALUES ($1, $2, $3, $4) RETURNING id`

func BenchmarkCheckStatement(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if err := checkStatement(benchPhaseSQL); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCommitStatement(b *testing.B) {
	q := newQueries("")
	ref := idemdriver.LockRef{ID: 42, Fence: 1, Scope: "user:7"}
	advance := idemdriver.CommitParams{Ref: ref, RecoveryPoint: "charge_created", Status: idemtype.StoredRunning,
		CheckpointPatch: map[string]json.RawMessage{"charge_id": json.RawMessage(`"ch_idem-0b9f1f5e-7d5c-4e43-9a53-2f1f6c2f0a11-charge_created"`)}}
	finish := idemdriver.CommitParams{Ref: ref, Status: idemtype.StoredFinished, Retention: 24 * time.Hour,
		CheckpointPatch: map[string]json.RawMessage{"job_id": json.RawMessage(`981`)},
		Response: &idemtype.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}, "X-Ride": {"123"}},
			Body: []byte(`{"ride_id":123,"amount":2000}`)}}
	for name, p := range map[string]idemdriver.CommitParams{"advance": advance, "finish": finish} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := q.commitStatement(p, ""); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
