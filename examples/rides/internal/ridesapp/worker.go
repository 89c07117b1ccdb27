package ridesapp

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
)

// ReceiptArgs is the receipt email job, queued by the last phase of the
// rides flow in the phase's own transaction.
type ReceiptArgs struct {
	RideID   int64  `json:"ride_id"`
	UserID   int64  `json:"user_id"`
	Email    string `json:"email"`
	ChargeID string `json:"charge_id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// ReceiptJobKind is ReceiptArgs' job kind in River's tables.
const ReceiptJobKind = "ride_receipt"

// Kind implements river.JobArgs.
func (ReceiptArgs) Kind() string { return ReceiptJobKind }

// ReceiptWorker "sends" the receipt email: it records the receipt, which is
// what the audit checks, and logs it.
//
// A queue delivers at least once: a job is retried after an error, and a
// job whose worker died before River recorded its completion runs again
// after the rescue delay. The receipt is therefore written with ON CONFLICT
// DO NOTHING against its unique ride_id, so however often the job runs, each
// ride has one receipt. (A real mailer would need the same care: send with
// the provider's idempotency key, or record the send first.)
type ReceiptWorker struct {
	river.WorkerDefaults[ReceiptArgs]

	pool   *pgxpool.Pool
	prefix string
	logger *slog.Logger
}

// Work implements river.Worker.
func (w *ReceiptWorker) Work(ctx context.Context, job *river.Job[ReceiptArgs]) error {
	a := job.Args
	tag, err := w.pool.Exec(ctx, `INSERT INTO `+w.prefix+`receipts (ride_id, user_id, email, charge_id, amount, currency)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (ride_id) DO NOTHING`,
		a.RideID, a.UserID, a.Email, a.ChargeID, a.Amount, a.Currency)
	if err != nil {
		return fmt.Errorf("rides: record receipt for ride %d: %w", a.RideID, err)
	}
	if tag.RowsAffected() == 0 {
		w.logger.InfoContext(ctx, "rides: receipt already sent", "ride_id", a.RideID, "job_id", job.ID, "attempt", job.Attempt)
		return nil
	}
	w.logger.InfoContext(ctx, "rides: receipt sent", "ride_id", a.RideID, "email", a.Email, "charge_id", a.ChargeID, "job_id", job.ID)
	return nil
}
