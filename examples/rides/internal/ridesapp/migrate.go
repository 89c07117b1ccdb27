package ridesapp

import (
	"context"
	_ "embed"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/go-idem/idem/examples/rides/fakepay"
	"github.com/go-idem/idem/migrations"
)

//go:embed schema.sql
var schemaSQL string

//go:embed citus.sql
var citusSQL string

// migrationLockKey is the transaction advisory lock that serialises Migrate
// across processes: the demo starts several serve processes at once, and
// concurrent CREATE TABLE IF NOT EXISTS statements can still collide. It is
// derived from the schema, so migrations of different schemas (parallel
// tests) do not wait for each other.
func migrationLockKey(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("rides migrations\x00" + schema))
	return int64(h.Sum64())
}

// Seeded users. The bad-source user's customer is fakepay's default declined
// customer, so every charge for them is refused with a card error.
const (
	GoodUserEmail      = "user@example.com"
	BadSourceUserEmail = "user-bad-source@example.com"
	goodCustomerID     = "cus_user_example_com"
	// BadSourceCustomerID is fakepay's default declined customer.
	BadSourceCustomerID = fakepay.DefaultDeclinedCustomer
)

// Migrate brings a database up to date for the rides service, in the order
// the tables depend on each other: idem's key table (package migrations),
// the rides schema (schema.sql, which references idem_keys), and River's job
// tables (rivermigrate). It is safe to call from many processes at once and
// on every start.
//
// schema qualifies every table when set and must already exist; empty uses
// the connection's search_path.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string, logger *slog.Logger) error {
	return migrate(ctx, pool, schema, logger, false)
}

// MigrateCitus is Migrate on a Citus coordinator: idem's tables are
// distributed by scope (migrations.Config.Citus), and the rides tables
// laid out next to them (citus.sql) the first time. River's tables stay
// tables of the coordinator.
func MigrateCitus(ctx context.Context, pool *pgxpool.Pool, schema string, logger *slog.Logger) error {
	return migrate(ctx, pool, schema, logger, true)
}

func migrate(ctx context.Context, pool *pgxpool.Pool, schema string, logger *slog.Logger, citus bool) (err error) {
	if logger == nil {
		logger = slog.Default()
	}
	prefix, err := migrations.QualifiedPrefix(schema)
	if err != nil {
		return fmt.Errorf("rides: migrate: %w", err)
	}

	// The lock is transaction-level, held by a transaction of its own that
	// stays open while the migrations run on other connections of the pool
	// (River's cannot all share one transaction): a session lock would
	// outlive the statement on a pooler's server connection (PgBouncer in
	// transaction mode hands it to other clients between transactions), and
	// its unlock could land on another one. The pool needs two connections.
	lock, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("rides: migrate: %w", err)
	}
	defer func() { _ = lock.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := lock.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrationLockKey(schema)); err != nil {
		return fmt.Errorf("rides: migrate: take the migration lock: %w", err)
	}

	idemMigrator, err := migrations.New(pool, &migrations.Config{Schema: schema, Citus: citus})
	if err != nil {
		return fmt.Errorf("rides: migrate idem: %w", err)
	}
	if _, err := idemMigrator.Up(ctx); err != nil {
		return fmt.Errorf("rides: migrate idem: %w", err)
	}

	if !citus {
		if _, err := pool.Exec(ctx, strings.ReplaceAll(schemaSQL, "{{schema}}", prefix)); err != nil {
			return fmt.Errorf("rides: migrate rides schema: %w", err)
		}
	} else if err := migrateCitus(ctx, pool, prefix); err != nil {
		return err
	}

	riverMigrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: schema, Logger: logger})
	if err != nil {
		return fmt.Errorf("rides: migrate river: %w", err)
	}
	if _, err := riverMigrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("rides: migrate river: %w", err)
	}
	return nil
}

// Seed inserts the two demo users if they are missing: GoodUserEmail, whose
// card always works, and BadSourceUserEmail, whose card is always declined.
func Seed(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	prefix, err := migrations.QualifiedPrefix(schema)
	if err != nil {
		return fmt.Errorf("rides: seed: %w", err)
	}
	_, err = pool.Exec(ctx, `INSERT INTO `+prefix+`users (email, customer_id) VALUES ($1, $2), ($3, $4)
		ON CONFLICT (email) DO NOTHING`,
		GoodUserEmail, goodCustomerID, BadSourceUserEmail, BadSourceCustomerID)
	if err != nil {
		return fmt.Errorf("rides: seed users: %w", err)
	}
	return nil
}

// migrateCitus applies schema.sql and, unless rides is distributed already,
// citus.sql, one statement at a time: Citus sends some commands on a
// distributed table to the workers with the whole string they came in, and
// refuses a string of several there.
func migrateCitus(ctx context.Context, pool *pgxpool.Pool, prefix string) error {
	var distributed bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass($1))`,
		prefix+"rides").Scan(&distributed); err != nil {
		return fmt.Errorf("rides: migrate rides schema: is rides distributed: %w", err)
	}
	// idem_keys's primary key is (scope, id) there, and Citus refuses the
	// foreign key's ON DELETE SET NULL anyway: rides.idempotency_key_id
	// references nothing (see citus.sql).
	ridesSQL := strings.Replace(schemaSQL, idemKeysReference, "", 1)
	if ridesSQL == schemaSQL {
		return fmt.Errorf("rides: migrate rides schema for Citus: schema.sql no longer says %q", idemKeysReference)
	}
	steps := sqlStatements(ridesSQL)
	if !distributed {
		steps = append(steps, sqlStatements(citusSQL)...)
	}
	for _, stmt := range steps {
		if _, err := pool.Exec(ctx, strings.ReplaceAll(stmt, "{{schema}}", prefix)); err != nil {
			return fmt.Errorf("rides: migrate rides schema for Citus: %w", err)
		}
	}
	return nil
}

// idemKeysReference is rides' foreign key to idem_keys in schema.sql.
const idemKeysReference = " REFERENCES {{schema}}idem_keys (id) ON DELETE SET NULL"

// sqlStatements splits the rides SQL files, which hold no semicolon but
// the ones ending their statements, into statements.
func sqlStatements(sql string) []string {
	var out []string
	for _, stmt := range strings.Split(sql, ";\n") {
		if strings.TrimSpace(stripComments(stmt)) != "" {
			out = append(out, stmt)
		}
	}
	return out
}

func stripComments(sql string) string {
	var b strings.Builder
	for _, line := range strings.Split(sql, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}
