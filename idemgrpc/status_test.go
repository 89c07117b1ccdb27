package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtest"
)

// Every outcome without a response maps to one code, reason and retry
// delay; the contract tests reach most of them over a connection, this
// table reaches them all.
func TestOutcomeStatus(t *testing.T) {
	t.Parallel()
	d := delays{unavailable: 5 * time.Second, reconcile: time.Minute, failed: time.Second}
	for _, tc := range []struct {
		name   string
		out    *idem.Outcome
		err    error
		code   codes.Code
		reason string
		retry  time.Duration
	}{
		{"in progress", &idem.Outcome{Kind: idem.OutcomeInProgress, RetryAfter: 2 * time.Second}, idem.ErrInProgress,
			codes.Aborted, ReasonInProgress, 2 * time.Second},
		{"in progress, no hint", &idem.Outcome{Kind: idem.OutcomeInProgress}, idem.ErrInProgress,
			codes.Aborted, ReasonInProgress, time.Second},
		{"lock lost", &idem.Outcome{Kind: idem.OutcomeLockLost}, idem.ErrLockLost,
			codes.Aborted, ReasonInProgress, time.Second},
		{"mismatch", &idem.Outcome{Kind: idem.OutcomeMismatch}, idem.ErrMismatch,
			codes.FailedPrecondition, ReasonKeyReused, 0},
		{"needs reconcile", &idem.Outcome{Kind: idem.OutcomeNeedsReconcile}, idem.ErrNeedsReconcile,
			codes.Unavailable, ReasonNeedsReconcile, time.Minute},
		{"request abandoned", &idem.Outcome{Kind: idem.OutcomeRequestAbandoned}, idem.ErrRequestAbandoned,
			codes.FailedPrecondition, ReasonRequestAbandoned, 0},
		{"store unavailable", &idem.Outcome{Kind: idem.OutcomeStoreUnavailable}, idem.ErrStoreUnavailable,
			codes.Unavailable, ReasonStoreUnavailable, 5 * time.Second},
		{"phase failed", &idem.Outcome{Kind: idem.OutcomeFailed}, fmt.Errorf("%w: provider down", idem.ErrPhaseFailed),
			codes.Unavailable, ReasonRequestFailed, time.Second},
		{"retries exhausted", &idem.Outcome{Kind: idem.OutcomeFailed}, fmt.Errorf("%w: phase x", idem.ErrRetriesExhausted),
			codes.Aborted, ReasonRequestFailed, time.Second},
		{"panic", &idem.Outcome{Kind: idem.OutcomeFailed}, fmt.Errorf("wrapped: %w", &idem.PanicError{Value: "boom"}),
			codes.Internal, ReasonRequestFailed, 0},
		{"unknown recovery point", &idem.Outcome{Kind: idem.OutcomeFailed}, fmt.Errorf("%w: x", idem.ErrUnknownRecoveryPoint),
			codes.Internal, ReasonRequestFailed, 0},
		{"invalid params", &idem.Outcome{Kind: idem.OutcomeInvalid}, fmt.Errorf("%w: NUL", idem.ErrInvalidParams),
			codes.InvalidArgument, ReasonInvalidRequest, 0},
		{"invalid scope", &idem.Outcome{Kind: idem.OutcomeInvalid}, fmt.Errorf("%w: scope", idem.ErrInvalidRequest),
			codes.Internal, ReasonInternal, 0},
		{"unknown kind", &idem.Outcome{Kind: "new_kind"}, errors.New("?"),
			codes.Internal, ReasonInternal, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st, ok := outcomeStatus(tc.out, tc.err, d, keySource{})
			require.True(t, ok)
			require.Equal(t, tc.code, st.Code())
			var info *errdetails.ErrorInfo
			var retry time.Duration
			for _, det := range st.Details() {
				switch v := det.(type) {
				case *errdetails.ErrorInfo:
					info = v
				case *errdetails.RetryInfo:
					retry = v.GetRetryDelay().AsDuration()
				}
			}
			require.Equal(t, tc.reason, info.GetReason())
			require.Equal(t, ErrorDomain, info.GetDomain())
			require.Equal(t, tc.retry, retry)
		})
	}

	st, ok := outcomeStatus(&idem.Outcome{Kind: idem.OutcomeFailed}, idemtest.ErrSimulatedCrash, d, keySource{})
	require.True(t, ok)
	require.Equal(t, codes.Unavailable, st.Code())
	st, ok = outcomeStatus(&idem.Outcome{Kind: idem.OutcomeCanceled}, fmt.Errorf("acquire: %w", context.Canceled), d, keySource{})
	require.True(t, ok)
	require.Equal(t, codes.Canceled, st.Code())
	for _, kind := range []idem.OutcomeKind{idem.OutcomeExecuted, idem.OutcomeReplayed} {
		_, ok := outcomeStatus(&idem.Outcome{Kind: kind}, nil, d, keySource{})
		require.False(t, ok, "%s has a response", kind)
	}
}

func TestIsUUID(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]bool{
		"8e03978e-40d5-43e8-bc93-6894a57f9324":       true,
		"8E03978E-40D5-43E8-BC93-6894A57F9324":       true,
		"00000000-0000-0000-0000-000000000000":       false,
		"8e03978e40d543e8bc936894a57f9324":           false,
		"{8e03978e-40d5-43e8-bc93-6894a57f9324}":     false,
		"urn:uuid:8e03978e-40d5-43e8-bc93-6894a57f9": false,
		"8e03978e-40d5-43e8-bc93-6894a57f932g":       false,
		"8e03978e-40d5-43e8-bc93_6894a57f9324":       false,
		"":                                           false,
	} {
		require.Equal(t, want, isUUID(s), s)
	}
}

// RetryDelay reads the RetryInfo of a status a client got, wrapped or not,
// and reports none for other errors.
func TestRetryDelay(t *testing.T) {
	t.Parallel()
	d := delays{unavailable: 5 * time.Second, reconcile: time.Minute, failed: time.Second}
	st, _ := outcomeStatus(&idem.Outcome{Kind: idem.OutcomeNeedsReconcile}, idem.ErrNeedsReconcile, d, keySource{})
	err := st.Err()
	delay, ok := RetryDelay(err)
	require.True(t, ok)
	require.Equal(t, time.Minute, delay)
	delay, ok = RetryDelay(fmt.Errorf("create ride: %w", err))
	require.True(t, ok, "a wrapped status")
	require.Equal(t, time.Minute, delay)

	st, _ = outcomeStatus(&idem.Outcome{Kind: idem.OutcomeMismatch}, idem.ErrMismatch, d, keySource{})
	_, ok = RetryDelay(st.Err())
	require.False(t, ok, "a status that invites no retry")
	_, ok = RetryDelay(errors.New("plain"))
	require.False(t, ok)
	_, ok = RetryDelay(nil)
	require.False(t, ok)
}
