package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem"
)

// The measured flow is shaped like rocket rides: create a ride, charge it
// through a provider (a fake with no latency, through run.Foreign) and
// record the charge, then enqueue a receipt job and respond 201. Every phase
// sends exactly one statement of its own; the runner and the baseline send
// the same three.
type rideInput struct {
	UserID int64  `json:"user_id"`
	Origin string `json:"origin"`
	Amount int64  `json:"amount"`
}

type rideResponse struct {
	RideID   int64  `json:"ride_id"`
	ChargeID string `json:"charge_id"`
	Amount   int64  `json:"amount"`
}

const flowName = "bench.rides"

// The business statements, per key table. businessMarker lets the
// round-trip counter tell a phase's own statements from idem's.
const businessMarker = "_rides"

func insertRideSQL(prefix string) string {
	return `INSERT INTO ` + prefix + `_rides (key_id, user_id, origin, amount) VALUES ($1, $2, $3, $4) RETURNING id`
}

func chargeRideSQL(prefix string) string {
	return `UPDATE ` + prefix + `_rides SET charge_id = $1 WHERE id = $2`
}

func insertJobSQL(prefix string) string {
	// The job names its ride in the table name's family, so the counter
	// recognises it too.
	return `INSERT INTO ` + prefix + `_jobs (kind, ride_id, args) VALUES ('receipt', $1, $2) /* ` + prefix + businessMarker + ` */`
}

func jobArgs(rideID int64) string {
	return `{"ride_id":` + strconv.FormatInt(rideID, 10) + `}`
}

// fakeCharge is the foreign call: no latency, a charge id derived from the
// downstream idempotency key, as a provider that deduplicates would return.
func fakeCharge(key string) string { return "ch_" + key }

func newRunnerFlow() *idem.Flow[rideInput] { return newRidesFlow(joinNone) }

// joins says which of the rides flow's phases share a transaction
// (Phase.JoinPrevious). The phases, their statements and the foreign call
// are the same in every variant; only the commits between them go.
type joins int

const (
	// joinNone: the key's acquisition commits on its own, then three
	// phases, three transactions: four commits, as the baseline.
	joinNone joins = iota
	// joinReceipt: the receipt, which makes no foreign call, joins the
	// charge's transaction: three commits.
	joinReceipt
	// joinAll: the charge joins the ride and the receipt joins both: the
	// acquisition and one transaction, two commits (as the
	// single-transaction contender, which commits its claim, then its
	// transaction).
	joinAll
)

func newRidesFlow(j joins) *idem.Flow[rideInput] {
	name := map[joins]string{joinNone: flowName, joinReceipt: flowName + ".joined", joinAll: flowName + ".onetx"}[j]
	return ridesFlow(name, j, rideStatements{insertRide: insertRideSQL("runner"), chargeRide: chargeRideSQL("runner"), insertJob: insertJobSQL("runner")})
}

// rideStatements are a rides flow's business statements. Scoped ones take
// the key's scope as their first argument ($1), ahead of the others.
type rideStatements struct {
	insertRide, chargeRide, insertJob string
	scoped                            bool
}

// args are a statement's arguments, the key's scope first when scoped.
func (st rideStatements) args(run *idem.Attempt[rideInput], args ...any) []any {
	if st.scoped {
		return append([]any{run.Key().Scope}, args...)
	}
	return args
}

func ridesFlow(name string, j joins, st rideStatements) *idem.Flow[rideInput] {
	return idem.MustNewFlow(name, []idem.Phase[rideInput]{
		{
			Name: "ride_created",
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) (idem.Result, error) {
				in := run.Input()
				var rideID int64
				if err := tx.QueryRow(ctx, st.insertRide, st.args(run, run.Key().ID, in.UserID, in.Origin, in.Amount)...).Scan(&rideID); err != nil {
					return idem.Result{}, fmt.Errorf("insert ride: %w", err)
				}
				return idem.Advance(), run.SetCheckpoint("ride_id", rideID)
			},
		},
		{
			Name:         "charge_created",
			JoinPrevious: j == joinAll,
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) (idem.Result, error) {
				var rideID int64
				if _, err := run.Checkpoint("ride_id", &rideID); err != nil {
					return idem.Result{}, err
				}
				var chargeID string
				if err := run.Foreign(ctx, "charge", func(_ context.Context, key string) error {
					chargeID = fakeCharge(key)
					return nil
				}); err != nil {
					return idem.Result{}, err
				}
				if _, err := tx.Exec(ctx, st.chargeRide, st.args(run, chargeID, rideID)...); err != nil {
					return idem.Result{}, fmt.Errorf("record charge: %w", err)
				}
				return idem.Advance(), run.SetCheckpoint("charge_id", chargeID)
			},
		},
		{
			Name:         "receipt_enqueued",
			JoinPrevious: j == joinReceipt || j == joinAll,
			Do: func(ctx context.Context, tx idem.Tx, run *idem.Attempt[rideInput]) (idem.Result, error) {
				var rideID int64
				var chargeID string
				if _, err := run.Checkpoint("ride_id", &rideID); err != nil {
					return idem.Result{}, err
				}
				if _, err := run.Checkpoint("charge_id", &chargeID); err != nil {
					return idem.Result{}, err
				}
				if _, err := tx.Exec(ctx, st.insertJob, st.args(run, rideID, jobArgs(rideID))...); err != nil {
					return idem.Result{}, fmt.Errorf("enqueue receipt: %w", err)
				}
				return idem.RespondJSON(http.StatusCreated, rideResponse{RideID: rideID, ChargeID: chargeID, Amount: run.Input().Amount}), nil
			},
		},
	}, nil)
}

// baseline is the hand-rolled implementation the runner is measured
// against: what a competent engineer writes without a library. Its own
// minimal key table; INSERT ... ON CONFLICT DO NOTHING for the key (and a
// SELECT when the key exists); each phase in its own transaction with its
// statement and a recovery-point update; the response stored with the last.
// It has no lease, fence, heartbeat, checkpoint data, header filtering,
// observer or test hooks: that difference is what the comparison prices.
//
// pipelined sends BEGIN with the phase's statement and COMMIT with the
// recovery-point update (pgx's Batch.BeginTx), the same round trips as the
// runner; without it each phase is the textbook BEGIN, statement, update,
// COMMIT: four round trips.
type baseline struct {
	pool      *pgxpool.Pool
	pipelined bool
}

var (
	errKeyMismatch      = errors.New("key reused with other params")
	errKeyInProgress    = errors.New("key in progress")
	errBaselineLockLost = errors.New("baseline: key row gone")
)

const (
	baseAcquireSQL = `INSERT INTO base_keys (scope, key, fingerprint, locked_at) VALUES ($1, $2, $3, now())
ON CONFLICT (scope, key) DO NOTHING RETURNING id`
	baseLookupSQL     = `SELECT id, fingerprint, locked_at IS NOT NULL, response_status, response_body FROM base_keys WHERE scope = $1 AND key = $2`
	baseAdvanceSQL    = `UPDATE base_keys SET recovery_point = $2 WHERE id = $1`
	baseFinishSQL     = `UPDATE base_keys SET recovery_point = 'finished', locked_at = NULL, response_status = $2, response_body = $3 WHERE id = $1`
	baseInsertRideSQL = `INSERT INTO base_rides (key_id, user_id, origin, amount) VALUES ($1, $2, $3, $4) RETURNING id`
)

// baseResult is what the baseline answers: executed or replayed.
type baseResult struct {
	status   int
	body     []byte
	replayed bool
}

func (b *baseline) run(ctx context.Context, scope, key string, in rideInput) (*baseResult, error) {
	keyID, answer, err := claimKey(ctx, b.pool, baseAcquireSQL, baseLookupSQL, scope, key, in)
	if err != nil || answer != nil {
		return answer, err
	}

	var rideID int64
	if err := b.phase(ctx, baseInsertRideSQL, []any{keyID, in.UserID, in.Origin, in.Amount}, []any{&rideID},
		baseAdvanceSQL, keyID, "ride_created"); err != nil {
		return nil, err
	}
	chargeID := fakeCharge("base-" + strconv.FormatInt(keyID, 10) + "-charge_created")
	if err := b.phase(ctx, chargeRideSQL("base"), []any{chargeID, rideID}, nil,
		baseAdvanceSQL, keyID, "charge_created"); err != nil {
		return nil, err
	}
	body, err := json.Marshal(rideResponse{RideID: rideID, ChargeID: chargeID, Amount: in.Amount})
	if err != nil {
		return nil, err
	}
	if err := b.phase(ctx, insertJobSQL("base"), []any{rideID, jobArgs(rideID)}, nil,
		baseFinishSQL, keyID, http.StatusCreated, body); err != nil {
		return nil, err
	}
	return &baseResult{status: http.StatusCreated, body: body}, nil
}

// claimKey claims key for a new request with acquireSQL (an INSERT ... ON
// CONFLICT DO NOTHING RETURNING id into a hand-rolled key table) and returns
// its id; when the key exists it returns lookupKey's answer instead. The
// baseline and the single-transaction contender claim alike, each in its
// own key table.
func claimKey(ctx context.Context, pool *pgxpool.Pool, acquireSQL, lookupSQL, scope, key string, in rideInput) (int64, *baseResult, error) {
	fp, err := baseFingerprint(in)
	if err != nil {
		return 0, nil, err
	}
	var keyID int64
	err = pool.QueryRow(ctx, acquireSQL, scope, key, fp).Scan(&keyID)
	if errors.Is(err, pgx.ErrNoRows) {
		answer, err := lookupKey(ctx, pool, lookupSQL, scope, key, fp)
		return 0, answer, err
	}
	if err != nil {
		return 0, nil, fmt.Errorf("claim: %w", err)
	}
	return keyID, nil, nil
}

// lookupKey answers a request whose key exists: a mismatch, the stored
// response replayed, or "in progress".
func lookupKey(ctx context.Context, pool *pgxpool.Pool, lookupSQL, scope, key string, fp []byte) (*baseResult, error) {
	var (
		keyID    int64
		storedFP []byte
		locked   bool
		status   *int
		body     []byte
	)
	if err := pool.QueryRow(ctx, lookupSQL, scope, key).Scan(&keyID, &storedFP, &locked, &status, &body); err != nil {
		return nil, fmt.Errorf("look up key: %w", err)
	}
	switch {
	case !bytes.Equal(storedFP, fp):
		return nil, errKeyMismatch
	case status != nil:
		return &baseResult{status: *status, body: body, replayed: true}, nil
	default:
		// A real implementation would resume (or, single-phase, rerun) an
		// unlocked key here; the benchmark never leaves one.
		return nil, errKeyInProgress
	}
}

// baseFingerprint is the baseline's request fingerprint: SHA-256 of the
// flow name and the JSON of the input (no canonicalisation: a hand-rolled
// implementation hashes what it has).
func baseFingerprint(in rideInput) ([]byte, error) {
	params, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	fp := sha256.Sum256(append([]byte(flowName+"\x00"), params...))
	return fp[:], nil
}

// phase runs one statement (scanning its row into dest, when given) and the
// key update in one transaction.
func (b *baseline) phase(ctx context.Context, sql string, args, dest []any, keySQL string, keyArgs ...any) error {
	if !b.pipelined {
		return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			var err error
			if dest != nil {
				err = tx.QueryRow(ctx, sql, args...).Scan(dest...)
			} else {
				_, err = tx.Exec(ctx, sql, args...)
			}
			if err != nil {
				return fmt.Errorf("baseline: phase statement: %w", err)
			}
			tag, err := tx.Exec(ctx, keySQL, keyArgs...)
			if err != nil {
				return fmt.Errorf("baseline: update key: %w", err)
			}
			if tag.RowsAffected() != 1 {
				return errBaselineLockLost
			}
			return nil
		})
	}

	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// A connection released inside a transaction (after an error) is
	// closed by the pool, so an error path leaks nothing.
	defer conn.Release()
	first := &pgx.Batch{}
	first.BeginTx(pgx.TxOptions{})
	first.Queue(sql, args...)
	br := conn.SendBatch(ctx, first)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return fmt.Errorf("baseline: begin: %w", err)
	}
	if dest != nil {
		err = br.QueryRow().Scan(dest...)
	} else {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("baseline: phase statement: %w", err)
	}

	last := &pgx.Batch{}
	last.Queue(keySQL, keyArgs...)
	last.Queue("commit")
	br = conn.SendBatch(ctx, last)
	tag, err := br.Exec()
	commitTag, commitErr := br.Exec()
	closeErr := br.Close()
	if err = errors.Join(err, commitErr, closeErr); err != nil {
		return fmt.Errorf("baseline: update key and commit: %w", err)
	}
	if tag.RowsAffected() != 1 || commitTag.String() != "COMMIT" {
		return errBaselineLockLost
	}
	return nil
}
