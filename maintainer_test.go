package idem_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemtype"
)

// workTally adds up what several maintainers report and says when all of
// the expected work is done. A reconcile verdict is not the end of a
// doubtful key's work: the pass goes on to drive the key to its response, so
// a doubtful key counts as done only when the commit of finishPhase (the
// sms flow's last phase, which stores the response) is reported.
type workTally struct {
	mu                          sync.Mutex
	reaped, completed, finished int
	completedKeys               map[string]int
	finishFlow, finishPhase     string
	want                        [3]int
	done                        chan struct{}
	closed                      bool
}

func (w *workTally) observer(own *countingObserver) idem.Observer {
	own.onEvent = func(e idem.Event) {
		w.mu.Lock()
		defer w.mu.Unlock()
		switch e.Kind {
		case idem.EventReaped:
			w.reaped += e.Count
		case idem.EventCompleted:
			w.completed++
			w.completedKeys[e.Key]++
		case idem.EventPhaseCommitted:
			if e.Flow != w.finishFlow || e.Phase != w.finishPhase {
				return
			}
			w.finished++
		default:
			return
		}
		if !w.closed && w.reaped >= w.want[0] && w.completed >= w.want[1] && w.finished >= w.want[2] {
			w.closed = true
			close(w.done)
		}
	}
	return own
}

// Two application instances run the maintenance services on one database at
// the same time: every expired key is deleted once, every abandoned request
// is completed once (one ride, one charge, one receipt each) and every
// needs_reconcile key is reconciled once (one message each). Both stop
// cleanly when their context ends.
func TestTwoMaintainersDoNoDoubleWork(t *testing.T) {
	t.Parallel()
	twoMaintainersDoNoDoubleWork(t, setupSMS(t))
}

func twoMaintainersDoNoDoubleWork(t *testing.T, b *smsBundle) {
	ctx := context.Background()
	const expired, abandoned, doubtful = 300, 12, 4

	b.insertKeys(t, "expired", expired, idemtype.KeyStateExpired, b.clock.Now())
	for i := range abandoned {
		b.abandon(t, fmt.Sprint("ab-", i))
	}
	for i := range doubtful {
		b.gateway.lose = true
		_, err := b.runner(t, nil).Execute(ctx, b.flow, b.req(fmt.Sprint("sms-", i)))
		require.ErrorIs(t, err, idem.ErrNeedsReconcile)
	}
	require.Equal(t, abandoned, b.provider.Charges())
	b.clock.Advance(10 * time.Minute)

	tally := &workTally{
		completedKeys: map[string]int{}, want: [3]int{expired, abandoned, doubtful}, done: make(chan struct{}),
		finishFlow: b.flow.Name(), finishPhase: b.flow.PhaseNames()[len(b.flow.PhaseNames())-1],
	}
	cfg := &idem.MaintainerConfig{
		ReapInterval: 5 * time.Millisecond, CompleteInterval: 5 * time.Millisecond, ReconcileInterval: 5 * time.Millisecond,
		Reap:      idem.ReapConfig{BatchSize: 7},
		Complete:  idem.CompleteConfig{IdleFor: time.Minute, BatchSize: 2},
		Reconcile: idem.ReconcileConfig{IdleFor: time.Minute, BatchSize: 1},
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	observers := []*countingObserver{newCountingObserver(), newCountingObserver()}
	stopped := make(chan error, len(observers))
	for _, obs := range observers {
		r := b.testBundle.runner(t, &idem.Config{Flows: []idem.AnyFlow{b.testBundle.flow, b.flow}, Observer: tally.observer(obs)})
		m, err := idem.NewMaintainer(r, cfg)
		require.NoError(t, err)
		go func() { stopped <- m.Serve(runCtx) }()
	}

	// A deadline on the wait only, so a broken maintainer fails the test
	// rather than hanging it; generous, as a loaded machine needs.
	select {
	case <-tally.done:
	case <-time.After(5 * time.Minute):
		tally.mu.Lock()
		defer tally.mu.Unlock()
		t.Fatalf("maintainers did not finish: reaped %d/%d, completed %d/%d, reconciled and finished %d/%d",
			tally.reaped, expired, tally.completed, abandoned, tally.finished, doubtful)
	}
	stop()
	for range observers {
		require.NoError(t, <-stopped)
	}

	for i, obs := range observers {
		t.Logf("maintainer %d: reaped %d, completed %d, reconciled %d", i,
			obs.sum(idem.EventReaped), obs.n(idem.EventCompleted), obs.n(idem.EventReconciled))
	}
	require.Equal(t, expired, observers[0].sum(idem.EventReaped)+observers[1].sum(idem.EventReaped))
	require.Equal(t, abandoned, observers[0].n(idem.EventCompleted)+observers[1].n(idem.EventCompleted))
	require.Equal(t, doubtful, observers[0].n(idem.EventReconciled)+observers[1].n(idem.EventReconciled))
	for key, n := range tally.completedKeys {
		require.Equal(t, 1, n, key)
	}

	require.Zero(t, b.countKeys(t, "expired"))
	require.Equal(t, abandoned, b.countRows(t, "idem_keys WHERE key LIKE 'ab-%' AND status = 'finished'"))
	require.Equal(t, abandoned, b.countRows(t, "rides"))
	require.Equal(t, abandoned, b.countRows(t, "jobs"), "one receipt per ride")
	require.Equal(t, abandoned, b.provider.Charges())
	for i := range doubtful {
		key := fmt.Sprint("sms-", i)
		require.Equal(t, idemtype.StoredFinished, b.key(t, key).Status)
		require.Equal(t, 1, b.gateway.times(b.ref(t, key)), key)
	}
}

// Cancelling the maintainer's context interrupts a request it is completing
// the way a client disconnect would: the phase rolls back, the key is
// released for the next pass, and Run returns.
func TestMaintainerStopsCleanly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.abandon(t, "k1")
	b.clock.Advance(10 * time.Minute)
	inPhase := make(chan struct{})
	b.hooks["charge_created"] = func(ctx context.Context, _ idem.Tx, _ *idem.Attempt[rideInput]) error {
		close(inPhase)
		<-ctx.Done()
		return ctx.Err()
	}
	m, err := idem.NewMaintainer(b.runner(t, nil), &idem.MaintainerConfig{
		ReapInterval: -1, ReconcileInterval: -1, Complete: idem.CompleteConfig{IdleFor: time.Minute},
	})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- m.Serve(ctx) }()

	<-inPhase
	require.ErrorIs(t, m.Serve(ctx), idem.ErrMaintainerRunning)
	stop()
	require.NoError(t, <-stopped)

	rec := b.key(t, "k1")
	require.Equal(t, idemtype.StoredRunning, rec.Status)
	require.Equal(t, "ride_created", rec.RecoveryPoint)
	require.Nil(t, rec.LockedAt, "released, not left for the lease to expire")
	require.Equal(t, 0, b.countRows(t, "jobs"))
}

func TestNewMaintainerChecksItsConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bare, err := idem.NewRunner(b.storeFor(t), nil)
	require.NoError(t, err)
	_, err = idem.NewMaintainer(bare, nil)
	require.ErrorIs(t, err, idem.ErrUnknownFlow, "completing needs the flows")
	m, err := idem.NewMaintainer(bare, &idem.MaintainerConfig{CompleteInterval: -1, ReconcileInterval: -1})
	require.NoError(t, err, "a reaper-only maintainer needs no flows")
	require.Equal(t, 5*time.Minute, m.Config().ReapInterval)
	require.Equal(t, 1000, m.Config().Reap.BatchSize)

	_, err = idem.NewMaintainer(nil, nil)
	require.Error(t, err)
	_, err = idem.NewMaintainer(b.runner(t, nil), &idem.MaintainerConfig{Reap: idem.ReapConfig{BatchSize: -5}})
	require.ErrorContains(t, err, "BatchSize")

	def, err := idem.NewMaintainer(b.runner(t, nil), nil)
	require.NoError(t, err)
	require.Equal(t, time.Minute, def.Config().CompleteInterval)
	require.Equal(t, time.Minute, def.Config().ReconcileInterval)
	require.Equal(t, 5*time.Minute, def.Config().Complete.IdleFor)
}
