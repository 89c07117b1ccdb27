package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// single is the single-transaction contender: the shape of a single-phase
// idempotency library, which claims the key in one transaction and then
// runs the whole request, with the stored response and the key's finish,
// in a second one. Two commits per request, where the runner and the
// baseline commit once per phase (four): it is what a library that does
// not split a request into phases costs, and what the runner has to match
// to be worth its recovery points.
//
// It is written as fast as a competent engineer would write it: its own
// minimal key table (single_keys, the baseline's shape), claimed with
// INSERT ... ON CONFLICT (scope, key) DO NOTHING RETURNING id and a SELECT
// when the key exists, which replays the stored response or answers "in
// progress" exactly as the baseline does; then BEGIN sent with the ride's
// insert, and the charge, the job, the key's finish and COMMIT sent
// together after the foreign call: three round trips for a new key. The
// business statements are the baseline's, on single_* tables of the same
// shape. Like the baseline it has no lease, fence, heartbeat or observer;
// a request that fails after the claim releases the key so that a retry
// runs again.
type single struct {
	pool *pgxpool.Pool
}

const (
	singleAcquireSQL = `INSERT INTO single_keys (scope, key, fingerprint, locked_at) VALUES ($1, $2, $3, now())
ON CONFLICT (scope, key) DO NOTHING RETURNING id`
	singleLookupSQL  = `SELECT id, fingerprint, locked_at IS NOT NULL, response_status, response_body FROM single_keys WHERE scope = $1 AND key = $2`
	singleFinishSQL  = `UPDATE single_keys SET recovery_point = 'finished', locked_at = NULL, response_status = $2, response_body = $3 WHERE id = $1`
	singleReleaseSQL = `DELETE FROM single_keys WHERE id = $1 AND response_status IS NULL`
)

func (s *single) run(ctx context.Context, scope, key string, in rideInput) (*baseResult, error) {
	// First transaction: the claim, committed on its own.
	keyID, answer, err := claimKey(ctx, s.pool, singleAcquireSQL, singleLookupSQL, scope, key, in)
	if err != nil || answer != nil {
		return answer, err
	}
	res, err := s.execute(ctx, keyID, in)
	if err != nil {
		// The transaction rolled back: nothing of the request is left, so
		// the claim goes too and a retry starts afresh.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, rerr := s.pool.Exec(rctx, singleReleaseSQL, keyID); rerr != nil {
			err = errors.Join(err, fmt.Errorf("single: release the key: %w", rerr))
		}
		return nil, err
	}
	return res, nil
}

// execute is the second transaction: the three business statements, the
// stored response and the key's finish, committed together.
func (s *single) execute(ctx context.Context, keyID int64, in rideInput) (*baseResult, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	// A connection released inside a transaction (after an error) is
	// closed by the pool, which rolls it back.
	defer conn.Release()

	first := &pgx.Batch{}
	first.BeginTx(pgx.TxOptions{})
	first.Queue(insertRideSQL("single"), keyID, in.UserID, in.Origin, in.Amount)
	br := conn.SendBatch(ctx, first)
	var rideID int64
	if _, err = br.Exec(); err == nil {
		err = br.QueryRow().Scan(&rideID)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("single: insert ride: %w", err)
	}

	chargeID := fakeCharge("single-" + strconv.FormatInt(keyID, 10) + "-charge")
	body, err := json.Marshal(rideResponse{RideID: rideID, ChargeID: chargeID, Amount: in.Amount})
	if err != nil {
		return nil, err
	}
	last := &pgx.Batch{}
	last.Queue(chargeRideSQL("single"), chargeID, rideID)
	last.Queue(insertJobSQL("single"), rideID, jobArgs(rideID))
	last.Queue(singleFinishSQL, keyID, http.StatusCreated, body)
	last.Queue("commit")
	br = conn.SendBatch(ctx, last)
	chargeTag, chargeErr := br.Exec()
	_, jobErr := br.Exec()
	finishTag, finishErr := br.Exec()
	commitTag, commitErr := br.Exec()
	closeErr := br.Close()
	if err := errors.Join(chargeErr, jobErr, finishErr, commitErr, closeErr); err != nil {
		return nil, fmt.Errorf("single: charge, job, finish and commit: %w", err)
	}
	if chargeTag.RowsAffected() != 1 || finishTag.RowsAffected() != 1 || commitTag.String() != "COMMIT" {
		return nil, errSingleKeyLost
	}
	return &baseResult{status: http.StatusCreated, body: body}, nil
}

var errSingleKeyLost = errors.New("single: ride or key row gone, nothing committed")
