package idem_test

import (
	"context"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/pgstore"
)

// A worker killed with SIGKILL in the middle of a phase holds its key's
// lease (90 s by default) when it dies. The key names its holder: instance,
// host and pid. Another instance answers a retry "in progress" until the
// lease runs out; the killed instance, restarted (a new process with the
// same pgstore.Config.Instance: here this test process), takes the key over
// at once, with the dead process's lease still running, and finishes it
// from its recovery point: on the client's retry, or in its first completer
// pass (which a Maintainer runs at start) when no client comes back.
func TestKill9ThenRestartResumesAtOnce(t *testing.T) {
	t.Parallel()
	for _, by := range []string{"retry", "completer"} {
		t.Run(by, func(t *testing.T) {
			t.Parallel()
			kill9ThenRestart(t, by)
		})
	}
}

func kill9ThenRestart(t *testing.T, by string) {
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const instance = "rides-0"
	req := b.request("k1", rideInput{Origin: "Paris", Amount: 7})

	pid := killChildInPhase(ctx, t, "_URL="+b.schema.URL, "_SCHEMA="+b.schema.Name, "_INSTANCE="+instance)

	held := b.key(t, "k1")
	host, _ := os.Hostname()
	require.Equal(t, "ride_created", held.RecoveryPoint)
	require.NotNil(t, held.LeaseExpiresAt, "a killed worker releases nothing")
	require.Equal(t, instance, held.HolderInstance)
	require.Equal(t, host, held.HolderHost)
	require.Equal(t, pid, held.HolderPID)

	runnerAs := func(instance string) *idem.Runner {
		store, err := pgstore.New(b.schema.Pool, &pgstore.Config{Schema: b.schema.Name, Instance: instance})
		require.NoError(t, err)
		t.Cleanup(store.Close)
		r, err := idem.NewRunner(store, &idem.Config{Flows: []idem.AnyFlow{b.flow}})
		require.NoError(t, err)
		return r
	}
	other := runnerAs("rides-1")
	out, err := other.Execute(ctx, b.flow, req)
	require.ErrorIs(t, err, idem.ErrInProgress, "another instance waits for the dead process's lease")
	require.Equal(t, idem.OutcomeInProgress, out.Kind)
	pass, err := other.Complete(ctx, nil)
	require.NoError(t, err)
	require.Zero(t, pass.Claimed, "another instance's completer leaves the key to the lease and IdleFor")

	restarted := time.Now()
	r := runnerAs(instance)
	if by == "retry" {
		out, err = r.Execute(ctx, b.flow, req)
		require.NoError(t, err)
		require.True(t, out.TookOver)
	} else {
		pass, err = r.Complete(ctx, nil)
		require.NoError(t, err)
		require.Equal(t, 1, pass.Completed, "the restarted instance's first completer pass resumes the key, idle or not")
	}
	resumed := time.Since(restarted)
	if by == "completer" {
		out, err = r.Execute(ctx, b.flow, req)
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeReplayed, out.Kind)
	}
	require.Equal(t, http.StatusCreated, out.Response.Status)
	require.True(t, time.Now().Before(*held.LeaseExpiresAt), "taken over while the dead process's lease still ran")
	require.Equal(t, held.Fence+1, b.key(t, "k1").Fence, "the takeover moved the fence once")
	require.Equal(t, 1, b.countRows(t, "rides"))
	require.Equal(t, 1, b.countRows(t, "rides WHERE origin = 'Paris'"), "the killed worker's write rolled back")
	require.Equal(t, 1, b.countRows(t, "jobs"))
	require.Equal(t, 1, b.provider.Charges())
	t.Logf("killed pid %d on %s (instance %s) in phase charge_created with %s of its lease left; restarted, the %s finished the key %.2f s after the restart",
		pid, host, instance, held.LeaseExpiresAt.Sub(restarted).Round(time.Second), by, resumed.Seconds())
}
