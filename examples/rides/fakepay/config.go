package fakepay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// DefaultDeclinedCustomer is the customer whose charges are declined when
// Config.DeclinedCustomers is left nil. The name follows Stripe's test
// fixtures: a customer whose card on file cannot be charged.
const DefaultDeclinedCustomer = "cus_bad_source"

// ErrInvalidConfig is wrapped by the error New returns for a Config that
// fails validation.
var ErrInvalidConfig = errors.New("fakepay: invalid config")

// Config configures a Server. The zero value is a well-behaved provider:
// no latency, no faults, and DefaultDeclinedCustomer declined.
type Config struct {
	// FailRate is the probability, from 0 to 1, that a valid charge request
	// is answered with a 500 api_error before anything else happens: nothing
	// is charged and nothing is stored under the idempotency key, so a retry
	// with the same key may charge.
	//
	// Defaults to 0.
	FailRate float64

	// DropRate is the probability, from 0 to 1, that a request which has
	// just created a charge gets no response at all: the charge is recorded
	// in the ledger and stored under the idempotency key, then the TCP
	// connection is closed. Replays and declines are never dropped, so a
	// retry with the same key always gets the charge back.
	//
	// Defaults to 0.
	DropRate float64

	// Latency is added to every request before it is handled, simulating a
	// provider that takes a while to answer. A request whose client goes
	// away during the wait is abandoned without effect. Requests wait in
	// parallel: latency on one key never delays another.
	//
	// Defaults to 0.
	Latency time.Duration

	// DeclinedCustomers lists customers whose charges are declined with a
	// 402 card_error.
	//
	// Defaults to []string{DefaultDeclinedCustomer} when nil. Set it to an
	// empty, non-nil slice to decline nobody.
	DeclinedCustomers []string

	// Seed seeds the random source that decides which requests get faults,
	// so that a run with a fixed seed and a fixed sequence of requests
	// injects the same faults every time.
	//
	// Defaults to 0, which means a seed taken from the current time.
	Seed int64

	// Logger receives a line per charge, decline and injected fault.
	//
	// Defaults to slog.Default().
	Logger *slog.Logger

	// Test holds hooks for tests. Leave it zero outside tests.
	Test TestConfig
}

// TestConfig holds hooks that let tests observe and pause a Server at
// points that can't be reached from outside without racing.
type TestConfig struct {
	// BeforeCharge, if set, is called by every request that is about to
	// decide between charging and declining: after validation, fault
	// injection and the replay check, while the request holds its
	// idempotency key. Blocking in it holds up later requests with the same
	// key and nothing else, which is how tests prove that keys are
	// serialised individually rather than behind one global lock.
	// idempotencyKey is empty for requests sent without a key.
	BeforeCharge func(ctx context.Context, idempotencyKey string)
}

// WithDefaults returns a copy of the Config with defaults filled in for
// unset fields. A nil Config yields all defaults.
func (c *Config) WithDefaults() *Config {
	if c == nil {
		c = &Config{}
	}

	declined := c.DeclinedCustomers
	if declined == nil {
		declined = []string{DefaultDeclinedCustomer}
	} else {
		// Copied so a caller mutating its slice after New can't change the
		// server under a running request.
		declined = append([]string{}, declined...)
	}

	logger := c.Logger
	if logger == nil {
		logger = slog.Default()
	}

	seed := c.Seed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}

	return &Config{
		FailRate:          c.FailRate,
		DropRate:          c.DropRate,
		Latency:           c.Latency,
		DeclinedCustomers: declined,
		Seed:              seed,
		Logger:            logger,
		Test:              c.Test,
	}
}

func (c *Config) validate() error {
	if err := validateRate("FailRate", c.FailRate); err != nil {
		return err
	}
	if err := validateRate("DropRate", c.DropRate); err != nil {
		return err
	}
	if c.Latency < 0 {
		return fmt.Errorf("%w: Latency must not be negative, got %s", ErrInvalidConfig, c.Latency)
	}
	for _, customer := range c.DeclinedCustomers {
		if customer == "" {
			return fmt.Errorf("%w: DeclinedCustomers must not contain an empty customer", ErrInvalidConfig)
		}
	}
	return nil
}

func validateRate(name string, rate float64) error {
	// The negated comparison also rejects NaN, for which every comparison
	// is false.
	if !(rate >= 0 && rate <= 1) {
		return fmt.Errorf("%w: %s must be between 0 and 1, got %v", ErrInvalidConfig, name, rate)
	}
	return nil
}
