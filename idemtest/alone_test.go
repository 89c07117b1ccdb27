package idemtest_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem/idemtest"
	"github.com/go-idem/idem/idemtype"
)

// A wire scenario that fails while others run beside it runs again alone,
// on a key of its own, and is held to that run: scenarios share the flow's
// tables, and a stalled one holds its row locks past the others'
// WireTimeout. Here the Check fails the first run of lost_reply@2 only, as
// a lock wait would. With WireParallelism 1 nothing runs beside it, and the
// failure stands.
func TestAWireScenarioThatFailsBesideOthersRunsAgainAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config(b.orderFlow("orders.alone", nil))
	cfg.DatabaseURL = b.url
	cfg.Kinds = []idemtest.Kind{idemtest.LostReply}
	cfg.Check = func(ctx context.Context, key *idemtype.KeyRecord) error {
		if strings.HasSuffix(key.Key, "-lost_reply@2") {
			return errors.New("waited on a row lock")
		}
		return b.oneChargedOrder(ctx, key)
	}
	rep, err := idemtest.ExploreContext(t.Context(), cfg)
	require.NoError(t, err)
	require.NoError(t, rep.Err())
	s := scenarioNamed(t, rep, "lost_reply@2")
	require.True(t, s.RanAlone)
	require.True(t, strings.HasSuffix(s.Key, "-lost_reply@2-alone"), s.Key)
	require.Contains(t, s.Steps[0], "it failed: Check: waited on a row lock")
	require.Contains(t, s.Steps[0], "lock contention")
	require.Contains(t, rep.Summary(), "(1 failed beside others and ran again alone), 0 failed")

	cfg.WireParallelism = 1
	rep, err = idemtest.ExploreContext(t.Context(), cfg)
	require.NoError(t, err)
	require.Len(t, rep.Failed(), 1)
	require.Equal(t, "lost_reply@2", rep.Failed()[0].Name)
	require.False(t, rep.Failed()[0].RanAlone)
}

// Every failed scenario's account is in the error, in the order they
// failed, after the first's.
func TestEveryFailedAccountIsReported(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config(b.orderFlow("orders.accounts", nil))
	cfg.Kinds = []idemtest.Kind{idemtest.CrashBeforeCommit}
	cfg.Check = func(ctx context.Context, key *idemtype.KeyRecord) error {
		if strings.Contains(key.Key, "crash_before_commit@") {
			return errors.New("broken on purpose")
		}
		return nil
	}
	rep, err := idemtest.ExploreContext(t.Context(), cfg)
	require.NoError(t, err)
	msg := rep.Err().Error()
	require.Contains(t, msg, "3 of 3 scenarios failed. The first:\n\nscenario crash_before_commit@order_created")
	require.Contains(t, msg, "also failed: crash_before_commit@charged, crash_before_commit@responded")
	second := strings.Index(msg, "failure 2 of 3:\nscenario crash_before_commit@charged")
	third := strings.Index(msg, "failure 3 of 3:\nscenario crash_before_commit@responded")
	require.Positive(t, second)
	require.Greater(t, third, second)
}
