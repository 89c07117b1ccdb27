package pgstore

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem/idemdriver"
)

// How a process finds out that a key its requests wait for is done
// (idemdriver.KeyWatcher; idem.Request.Wait): one watch per key, shared by
// every waiter of the process, and one LISTEN connection per store, shared
// by every watch.
//
// A watch marks its key once (queries.waitMark), so that the statement that
// ends the key's attempt, on any instance, notifies the schema's channel
// with the key's id; the listener wakes the watch, and the watch wakes its
// waiters, who acquire the key again. A waiter holds no connection. Each
// watch also re-checks its key itself (queries.waitCheck): at its lease's
// expiry (a dead holder: a waiter then takes the key over), every
// listenRecheck while the listener listens (a notification lost to a
// reconnect, a key finished by a release that does not notify, a phase at
// repeatable read that could not see the mark), and on a polling schedule
// (pollFirst doubling to pollMax) when there is no listener: Config.
// WaitPolling, a pooler in transaction mode, a handle that is not a
// *pgxpool.Pool, or a LISTEN connection that failed.
const (
	listenRecheck = 5 * time.Second
	pollFirst     = 100 * time.Millisecond
	pollMax       = time.Second
	// listenRetry is the pause before the listener connects again.
	listenRetry = time.Second
)

// channelPrefix starts the name of every schema's channel.
const channelPrefix = "idem_finished:"

// Channel returns the notification channel of the keys in schema: what
// migration 0010's idem_notify_waiters_v10 notifies, "idem_finished:"
// followed by the schema's name, or by its md5 in hex when the name would be
// longer than the 63 bytes a channel name may have.
func Channel(schema string) string {
	ch := channelPrefix + schema
	if len(ch) > 63 {
		sum := md5.Sum([]byte(schema))
		ch = channelPrefix + hex.EncodeToString(sum[:])
	}
	return ch
}

// waits is a store's watches and its listener.
type waits struct {
	st *Store
	// conn is the listener's configuration; nil: no listener, poll.
	conn *pgx.ConnConfig
	// sessionPooler is Config.SessionPooler: LISTEN works through a pooler.
	sessionPooler bool

	mu      sync.Mutex
	watches map[int64]*watch
	// started says the listener goroutine runs.
	started bool
	// listening says the listener is LISTENing now.
	listening atomic.Bool
	// unheard says the listener gave up: LISTEN cannot work here.
	unheard atomic.Bool
	// notified counts the notifications the listener received.
	notified atomic.Int64

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// watch is one key's: closed wakes every waiter of the process.
type watch struct {
	ref     idemdriver.LockRef
	woken   chan struct{}
	recheck chan struct{}
	waiters int
	stop    context.CancelFunc
}

func newWaits(st *Store, db DB, config *Config) *waits {
	w := &waits{st: st, watches: map[int64]*watch{}, sessionPooler: config.SessionPooler, done: make(chan struct{})}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	switch pool, ok := db.(*pgxpool.Pool); {
	case config.WaitPolling:
	case config.ListenConfig != nil:
		w.conn = config.ListenConfig.Copy()
	case ok:
		w.conn = pool.Config().ConnConfig.Copy()
	}
	return w
}

var _ idemdriver.KeyWatcher = (*Store)(nil)

// WatchKey implements idemdriver.KeyWatcher: the channel is closed when the
// attempt that holds ref may be over, which a waiter finds out by acquiring
// the key again; stop ends the caller's interest. The first waiter of a key
// in the process marks it (one statement, at read committed) and starts
// its watch; the others share it.
func (s *Store) WatchKey(ctx context.Context, ref idemdriver.LockRef) (<-chan struct{}, func()) {
	w := s.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn != nil && !w.started && w.ctx.Err() == nil {
		// Started under w.mu, as close reads started: a listener starts
		// before Close cancels w.ctx, or never.
		w.started = true
		go w.listen()
	}
	wt := w.watches[ref.ID]
	if wt == nil || wt.ref.Fence != ref.Fence {
		if wt != nil {
			// Another attempt holds the key now: wake the old watch's
			// waiters, who find that out.
			w.wakeLocked(wt)
		}
		var wctx context.Context
		wt = &watch{ref: ref, woken: make(chan struct{}), recheck: make(chan struct{}, 1)}
		wctx, wt.stop = context.WithCancel(w.ctx)
		w.watches[ref.ID] = wt
		go w.run(wctx, wt)
	}
	wt.waiters++
	return wt.woken, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		wt.waiters--
		if wt.waiters == 0 && w.watches[ref.ID] == wt {
			delete(w.watches, ref.ID)
			wt.stop()
		}
	}
}

// Notifications returns how many wake-ups the store's listener has received
// on its channel since it started, for tests and metrics.
func (s *Store) Notifications() int64 { return s.waits.notified.Load() }

// Listening reports whether the store's listener LISTENs on its channel
// now; false: its watches poll (no waiter yet, Config.WaitPolling, a
// transaction pooler, or a listener that cannot connect), for tests and
// metrics.
func (s *Store) Listening() bool { return s.waits.listening.Load() }

// wakeLocked closes wt and forgets it; w.mu is held.
func (w *waits) wakeLocked(wt *watch) {
	if w.watches[wt.ref.ID] == wt {
		delete(w.watches, wt.ref.ID)
	}
	select {
	case <-wt.woken:
	default:
		close(wt.woken)
	}
	wt.stop()
}

func (w *waits) wake(wt *watch) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.wakeLocked(wt)
}

// wakeKey wakes the watch of the key with id, if any.
func (w *waits) wakeKey(id int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if wt := w.watches[id]; wt != nil {
		w.wakeLocked(wt)
	}
}

// recheckAll has every watch check its key now: after the listener
// (re)connects, as a notification may have been missed while it did not
// listen. One statement per key, not an acquisition per waiter.
func (w *waits) recheckAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, wt := range w.watches {
		select {
		case wt.recheck <- struct{}{}:
		default:
		}
	}
}

// run is one key's watch: it marks the key, then re-checks it at its lease's
// expiry and on its schedule, until the key's attempt is over (wake), the
// listener wakes it, or its last waiter leaves.
func (w *waits) run(ctx context.Context, wt *watch) {
	// A process that does not listen does not mark: a mark makes the
	// finishing statement notify, which nobody here would hear.
	mark := w.st.checkWaited
	if w.conn != nil && !w.unheard.Load() {
		mark = w.st.markWaited
	}
	over, left, err := mark(ctx, wt.ref)
	if errors.Is(err, pgx.ErrNoRows) {
		over, err = true, nil
	}
	interval := pollFirst
	for {
		if err == nil && over {
			w.wake(wt)
			return
		}
		next := interval
		if w.listening.Load() {
			next = listenRecheck
		} else {
			interval = min(interval*2, pollMax)
		}
		if err == nil && left > 0 {
			// A dead holder's lease runs out: wake then, so that a waiter
			// takes the key over.
			next = min(next, left+10*time.Millisecond)
		}
		t := time.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-wt.recheck:
			t.Stop()
		}
		over, left, err = w.st.checkWaited(ctx, wt.ref)
		if errors.Is(err, pgx.ErrNoRows) {
			// The key is gone (reaped, abandoned): the waiters find out.
			over, err = true, nil
		}
	}
}

// markWaited marks the key as waited for and reports whether its attempt
// is over and how long its lease has left.
func (s *Store) markWaited(ctx context.Context, ref idemdriver.LockRef) (over bool, left time.Duration, err error) {
	sctx, cancel := context.WithTimeout(ctx, beginTimeout)
	defer cancel()
	tx, err := s.control.BeginTx(sctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return false, 0, mapError(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(sctx)) }()
	var secs float64
	err = tx.QueryRow(sctx, s.q.waitMark, ref.ID, ref.Fence).Scan(&over, &secs)
	if errors.Is(err, pgx.ErrNoRows) {
		return true, 0, nil
	}
	if err == nil {
		err = tx.Commit(sctx)
	}
	if err != nil {
		return false, 0, mapError(err)
	}
	return over, time.Duration(secs * float64(time.Second)), nil
}

// checkWaited reports whether the key's attempt is over and how long its
// lease has left; pgx.ErrNoRows when the key is gone.
func (s *Store) checkWaited(ctx context.Context, ref idemdriver.LockRef) (over bool, left time.Duration, err error) {
	sctx, cancel := context.WithTimeout(ctx, beginTimeout)
	defer cancel()
	var secs float64
	if err := s.control.QueryRow(sctx, s.q.waitCheck, ref.ID, ref.Fence).Scan(&over, &secs); err != nil {
		return false, 0, err
	}
	return over, time.Duration(secs * float64(time.Second)), nil
}

// listen holds the store's LISTEN connection until Close, connecting again
// after a failure; while it does not listen, watches poll.
func (w *waits) listen() {
	defer close(w.done)
	for w.ctx.Err() == nil {
		if !w.listenOnce() {
			w.unheard.Store(true)
			return
		}
		t := time.NewTimer(listenRetry)
		select {
		case <-w.ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// listenOnce connects, LISTENs and receives notifications until the
// connection fails; false when listening cannot work here (a pooler in
// transaction mode), so that the watches poll from then on.
func (w *waits) listenOnce() bool {
	ctx := w.ctx
	cctx, cancel := context.WithTimeout(ctx, schemaCheckTimeout)
	conn, err := pgx.ConnectConfig(cctx, w.conn)
	if err != nil {
		cancel()
		return true
	}
	defer func() { _ = conn.Close(context.Background()) }()
	var backend uint32
	var schema *string
	err = conn.QueryRow(cctx, `SELECT pg_backend_pid(), (SELECT n.nspname::text FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1))`,
		pgx.QueryExecModeSimpleProtocol, w.st.q.leases).Scan(&backend, &schema)
	if err == nil && backend != conn.PgConn().PID() && !w.sessionPooler {
		// A pooler hands this session's statements to any server
		// connection: a LISTEN would be lost with the next one.
		cancel()
		return false
	}
	if err == nil && schema == nil {
		err = errors.New("no idem_leases table")
	}
	if err == nil {
		_, err = conn.Exec(cctx, "LISTEN "+pgx.Identifier{Channel(*schema)}.Sanitize())
	}
	cancel()
	if err != nil {
		return true
	}
	w.listening.Store(true)
	defer w.listening.Store(false)
	// Whatever finished before LISTEN took effect is looked at again.
	w.recheckAll()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true
		}
		w.notified.Add(1)
		if id, err := strconv.ParseInt(n.Payload, 10, 64); err == nil {
			w.wakeKey(id)
		}
	}
}

// close stops the listener and every watch, and waits for the listener.
// Close may be called more than once.
func (w *waits) close() {
	w.mu.Lock()
	// No listener starts after Close (WatchKey checks w.ctx).
	w.cancel()
	started := w.started
	w.mu.Unlock()
	if started {
		<-w.done
	}
}
