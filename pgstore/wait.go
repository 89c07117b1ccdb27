package pgstore

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idem/idem/idemdriver"
	"github.com/go-idem/idem/internal/hooks"
)

// How a process finds out that a key its requests wait for is done
// (idemdriver.Store.WatchKey; idem.Request.Wait): one watch per key, shared by
// every waiter of the process, one LISTEN connection per store, shared by
// every watch, and one checker per store, which checks every watched key
// due at a tick with one statement.
//
// A watch marks its key once (queries.waitMark, then queries.waitCheck in
// the same transaction), so that the statement that ends the key's
// attempt, on any instance, notifies the schema's channel with the key's
// id; the listener wakes the watch, and the watch wakes its waiters, who
// acquire the key again. A waiter holds no connection. The checker also
// checks each watched key itself (queries.waitCheckAll): at its lease's
// expiry (a dead holder: a waiter then takes the key over), every
// listenRecheck while the listener listens (a notification lost to a
// reconnect, or missed by a finish at repeatable read whose snapshot
// predates the mark), and on a polling schedule (pollFirst doubling to
// pollMax) when there is no listener: WaitPoll, a pooler in transaction
// mode (WaitAuto), a handle that is not a *pgxpool.Pool, Citus, or a LISTEN
// connection that is down. This checker is the one loop: the runner has no
// poller of its own. While the listener is down (it failed to
// connect, and has not listened since), new watches do not mark their key:
// nobody would hear the notification; once it listens again, they do.
//
// The marks and checks run on the store's main pool, never on its control
// pool, which heartbeats must find free.
const (
	listenRecheck = 5 * time.Second
	pollFirst     = 100 * time.Millisecond
	pollMax       = time.Second
	// listenRetry is the pause before the listener connects again.
	listenRetry = time.Second
	// listenWarnEvery bounds how often a listener that cannot listen logs.
	listenWarnEvery = time.Minute
)

// Wait says how a store finds out that a key its requests wait for
// (idem.Request.Wait, Prefer: wait over HTTP) is done: Config.Wait. Either
// way one loop of the store checks every watched key once per tick for all
// the process's waiters; notifications only wake it sooner. The zero value
// is WaitAuto.
type Wait struct {
	mode waitMode
	conn *pgx.ConnConfig
}

type waitMode int

const (
	waitAuto waitMode = iota
	waitPoll
	waitListen
)

var (
	// WaitAuto (the default) LISTENs on the schema's channel
	// ("idem_finished:" and the schema's name, or its md5 when that is too
	// long) on a connection of its own with db's configuration, opened on
	// the first wait and closed by Close, and checks each watched key every
	// 5 s and at its lease's expiry. It polls instead (every
	// 100 ms, backing off to 1 s) while that connection is down, for good
	// behind a connection pooler in transaction mode (detected on the first
	// wait), where LISTEN does not work, when db is not a *pgxpool.Pool,
	// and on Citus.
	WaitAuto = Wait{}
	// WaitPoll never LISTENs: every watched key is checked every 100 ms,
	// backing off to 1 s, once per process however many requests wait.
	WaitPoll = Wait{mode: waitPoll}
)

// WaitListen LISTENs on conn, a connection to Postgres itself (for a db
// behind a connection pooler in transaction mode, where a LISTEN would be
// lost), or, with a nil conn, on db's configuration, as WaitAuto does but
// without looking for a pooler: it says db's connections keep their
// session (a direct connection, or a pooler in session mode such as
// PgBouncer pool_mode=session), and New then accepts every query exec mode
// (see ErrPoolerExecMode). The pool's BeforeConnect hook runs before each
// connect of db's configuration, not of conn.
func WaitListen(conn *pgx.ConnConfig) Wait {
	if conn != nil {
		conn = conn.Copy()
	}
	return Wait{mode: waitListen, conn: conn}
}

// String names the mode: "auto", "poll" or "listen".
func (w Wait) String() string {
	return [...]string{"auto", "poll", "listen"}[w.mode]
}

// channelPrefix starts the name of every schema's channel.
const channelPrefix = "idem_finished:"

// channel returns the notification channel of the keys in schema: what
// idem_notify_waiters (migration 0007) notifies, "idem_finished:"
// followed by the schema's name, or by its md5 in hex when the name would be
// longer than the 63 bytes a channel name may have.
func channel(schema string) string {
	ch := channelPrefix + schema
	if len(ch) > 63 {
		sum := md5.Sum([]byte(schema))
		ch = channelPrefix + hex.EncodeToString(sum[:])
	}
	return ch
}

// closedChan is closed: what WatchKey returns when there is nothing to wait
// for.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// waits is a store's watches, its checker and its listener.
type waits struct {
	st *Store
	// conn is the listener's configuration; nil: no listener, poll.
	conn *pgx.ConnConfig
	// beforeConnect is the pool's BeforeConnect hook, run on conn before
	// each connect (credentials that rotate, say); nil: none.
	beforeConnect func(context.Context, *pgx.ConnConfig) error
	// trusted says the listener's connection keeps its session (WaitListen):
	// it does not look for a pooler.
	trusted bool
	log     *slog.Logger

	mu      sync.Mutex
	watches map[int64]*watch
	// started says the listener goroutine runs; checking, the checker's.
	started, checking bool
	// closed says Close was called: no watch starts any more.
	closed bool
	// lastWarn is when the listener last logged that it cannot listen.
	lastWarn time.Time
	// listening says the listener is LISTENing now.
	listening atomic.Bool
	// down says the listener failed and has not listened since: watches
	// poll and do not mark.
	down atomic.Bool
	// unheard says the listener gave up: LISTEN cannot work here.
	unheard atomic.Bool
	// notified counts the notifications the listener received.
	notified atomic.Int64

	// kick wakes the checker: a watch became due, or every watch is.
	kick chan struct{}
	ctx  context.Context
	// cancel ends the listener, the checker and the marks.
	cancel context.CancelFunc
	// wg counts the goroutines Close waits for.
	wg sync.WaitGroup
}

// watch is one key's: closing woken wakes every waiter of the process. Its
// fields other than ref and woken are guarded by waits.mu.
type watch struct {
	ref     idemdriver.LockRef
	woken   chan struct{}
	waiters int
	// marking says its mark runs; marked that it was made.
	marking, marked bool
	// ready says the checker checks it, at next; interval is its polling
	// interval now. lapsed: its waiters found their attempt still holding
	// the key after its lease looked run out here (idemdriver.Watch.Lapsed):
	// it is woken at a check, never by its mark, and polls.
	lapsed   bool
	ready    bool
	next     time.Time
	interval time.Duration
}

func newWaits(st *Store, db DB, config *Config) *waits {
	w := &waits{st: st, watches: map[int64]*watch{}, trusted: config.Wait.mode == waitListen,
		log: config.Logger, kick: make(chan struct{}, 1)}
	if w.log == nil {
		w.log = slog.Default()
	}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	switch pool, ok := db.(*pgxpool.Pool); {
	case config.Wait.mode == waitPoll:
	case config.Wait.conn != nil:
		w.conn = config.Wait.conn.Copy()
	case ok:
		pc := pool.Config()
		w.conn = pc.ConnConfig.Copy()
		w.beforeConnect = pc.BeforeConnect
	}
	return w
}

// WatchKey implements idemdriver.Store: the channel is closed when the
// attempt that holds want.Ref may be over, which a waiter finds out by
// acquiring the key again; stop ends the caller's interest. The first
// waiter of a key in the process marks it (one transaction, at read
// committed) and starts its watch; the others share it. A ref older than
// the key's watch (a lower fence) is over already: its channel is closed.
// After Close, every channel is closed.
func (s *Store) WatchKey(ctx context.Context, want idemdriver.Watch) (<-chan struct{}, func()) {
	ref := want.Ref
	w := s.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return closedChan, func() {}
	}
	if w.conn != nil && !w.started {
		w.started = true
		w.wg.Add(1)
		go w.listen()
	}
	if !w.checking {
		w.checking = true
		w.wg.Add(1)
		go w.check()
	}
	wt := w.watches[ref.ID]
	switch {
	case wt != nil && ref.Fence < wt.ref.Fence:
		// The key's attempt moved on since this waiter looked.
		return closedChan, func() {}
	case wt == nil || ref.Fence > wt.ref.Fence:
		if wt != nil {
			// Another attempt holds the key now: wake the old watch's
			// waiters, who find that out.
			w.wakeLocked(wt)
		}
		wt = &watch{ref: ref, woken: make(chan struct{}), interval: pollFirst, lapsed: want.Lapsed}
		w.watches[ref.ID] = wt
		w.markLocked(wt)
	}
	wt.waiters++
	return wt.woken, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		wt.waiters--
		if wt.waiters == 0 && w.watches[ref.ID] == wt {
			delete(w.watches, ref.ID)
		}
	}
}

// waitsNow is what the store's key watcher has done, for tests (through
// hooks.StoreWaits): how many wake-ups its listener has received on its
// channel since it started; whether it LISTENs now (false: its watches
// poll: no waiter yet, WaitPoll, a transaction pooler, or a listener that
// cannot connect); and whether it polls for good, having no way to listen
// here (WaitPoll, a handle that is not a *pgxpool.Pool without WaitListen's
// connection, or a transaction pooler its listener found on the first wait,
// WaitAuto).
func (s *Store) waitsNow() hooks.Waits {
	return hooks.Waits{
		Notifications: s.waits.notified.Load(),
		Listening:     s.waits.listening.Load(),
		Polling:       s.waits.conn == nil || s.waits.unheard.Load(),
	}
}

func init() {
	hooks.StoreWaits = func(store any) hooks.Waits { return store.(*Store).waitsNow() }
	hooks.StoreChannel = channel
	hooks.StoreTable = func(store any) (string, bool) {
		s, ok := store.(*Store)
		if !ok {
			return "", false
		}
		return s.q.table, true
	}
}

// markLocked starts wt's mark: it marks the key when the listener may hear
// the notification, checks it either way, and hands the watch to the
// checker; w.mu is held. Only Close cancels a mark: a watch woken, or left
// by its waiters, meanwhile lets it finish (a round trip, bounded by
// beginTimeout), since cancelling a statement sends a cancel request, a
// connection of its own to the server (through a pooler, one of its server
// connections), which PgBouncer 1.18 exits on when the cancel's client
// hangs up before it was forwarded, as pgx's does once the statement it
// cancels returns.
func (w *waits) markLocked(wt *watch) {
	mark := w.conn != nil && !w.unheard.Load() && !w.down.Load()
	wt.marking = true
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		var over bool
		var left time.Duration
		var err error
		if mark {
			over, left, err = w.st.markWaited(w.ctx, wt.ref)
		} else {
			over, left, err = w.st.checkWaited(w.ctx, wt.ref)
		}
		if errors.Is(err, pgx.ErrNoRows) {
			over, err = true, nil
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		wt.marking = false
		if w.watches[wt.ref.ID] != wt {
			return // woken, left by its waiters, or replaced meanwhile
		}
		if err == nil && over && !wt.lapsed {
			w.wakeLocked(wt)
			return
		}
		wt.marked = mark && err == nil
		w.scheduleLocked(wt, time.Now(), left, err == nil)
		wt.ready = true
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}()
}

// scheduleLocked sets when the checker checks wt next: on the polling
// schedule, or every listenRecheck while listening, and at the expiry of
// its holder's lease (left, when known); w.mu is held.
func (w *waits) scheduleLocked(wt *watch, now time.Time, left time.Duration, known bool) {
	next := wt.interval
	if w.listening.Load() && wt.marked && !wt.lapsed {
		next = listenRecheck
	} else {
		wt.interval = min(wt.interval*2, pollMax)
	}
	if known && left > 0 && !wt.lapsed {
		// A dead holder's lease runs out: wake then, so that a waiter
		// takes the key over.
		next = min(next, left+10*time.Millisecond)
	}
	wt.next = now.Add(next)
}

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
}

// wakeKey wakes the watch of the key with id, if any.
func (w *waits) wakeKey(id int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if wt := w.watches[id]; wt != nil {
		w.wakeLocked(wt)
	}
}

// relisten runs when the listener (re)starts listening: every watch checks
// its key at once, since a notification may have come while it did not
// listen, and a watch that did not mark its key (the listener was down)
// marks it now.
func (w *waits) relisten() {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	for _, wt := range w.watches {
		if !wt.marked && !wt.marking && !w.closed {
			w.markLocked(wt)
			continue
		}
		wt.next = now
	}
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// check is the store's checker: at each tick it checks, with one
// statement, every ready watch that is due, or nearly (within half its
// interval, so that watches share ticks), and wakes those whose key's
// attempt is over, until Close.
func (w *waits) check() {
	defer w.wg.Done()
	var ids, fences []int64
	var scopes []string
	for {
		w.mu.Lock()
		now := time.Now()
		ids, fences, scopes = ids[:0], fences[:0], scopes[:0]
		due := map[int64]*watch{}
		var earliest time.Time
		for id, wt := range w.watches {
			if !wt.ready {
				continue
			}
			if !wt.next.After(now.Add(min(wt.interval, listenRecheck) / 2)) {
				ids, fences, scopes = append(ids, id), append(fences, wt.ref.Fence), append(scopes, wt.ref.Scope)
				due[id] = wt
			} else if earliest.IsZero() || wt.next.Before(earliest) {
				earliest = wt.next
			}
		}
		w.mu.Unlock()
		if len(ids) > 0 {
			var results map[int64]waitState
			var err error
			if w.st.q.citus {
				refs := make([]idemdriver.LockRef, 0, len(due))
				for _, wt := range due {
					refs = append(refs, wt.ref)
				}
				results, err = w.st.checkAllWaitedCitus(w.ctx, refs)
			} else {
				results, err = w.st.checkAllWaited(w.ctx, ids, fences, scopes)
			}
			w.mu.Lock()
			now = time.Now()
			for id, wt := range due {
				if w.watches[id] != wt {
					continue // woken, or replaced, meanwhile
				}
				r, ok := results[id]
				if err == nil && ok && r.over {
					w.wakeLocked(wt)
					continue
				}
				w.scheduleLocked(wt, now, r.left, err == nil && ok)
				if earliest.IsZero() || wt.next.Before(earliest) {
					earliest = wt.next
				}
			}
			w.mu.Unlock()
		}
		var timer <-chan time.Time
		t := time.NewTimer(time.Until(earliest))
		if !earliest.IsZero() {
			timer = t.C
		}
		select {
		case <-w.ctx.Done():
			t.Stop()
			return
		case <-w.kick:
		case <-timer:
		}
		t.Stop()
	}
}

// markWaited marks the key as waited for and reports whether its attempt
// is over and how long its lease has left: the mark, then the check, in
// one read-committed transaction on the main pool.
func (s *Store) markWaited(ctx context.Context, ref idemdriver.LockRef) (over bool, left time.Duration, err error) {
	sctx, cancel := context.WithTimeout(ctx, beginTimeout)
	defer cancel()
	tx, err := s.db.BeginTx(sctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return false, 0, mapError(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(sctx)) }()
	b := &pgx.Batch{}
	b.Queue(s.q.waitMark, ref.ID, ref.Fence, ref.Scope)
	b.Queue(s.q.waitCheck, ref.ID, ref.Fence, ref.Scope)
	br := tx.SendBatch(sctx, b)
	var marked bool
	var secs float64
	err = br.QueryRow().Scan(&marked, &secs)
	if errors.Is(err, pgx.ErrNoRows) {
		_ = br.Close()
		return true, 0, nil
	}
	if err == nil {
		err = br.QueryRow().Scan(&over, &secs)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		over, err = true, nil
	}
	err = errors.Join(err, br.Close())
	if err == nil {
		err = tx.Commit(sctx)
	}
	if err != nil {
		return false, 0, mapError(err)
	}
	return over || marked, time.Duration(secs * float64(time.Second)), nil
}

// checkWaited reports whether the key's attempt is over and how long its
// lease has left; pgx.ErrNoRows when the key is gone.
func (s *Store) checkWaited(ctx context.Context, ref idemdriver.LockRef) (over bool, left time.Duration, err error) {
	sctx, cancel := context.WithTimeout(ctx, beginTimeout)
	defer cancel()
	var secs float64
	if err := s.db.QueryRow(sctx, s.q.waitCheck, ref.ID, ref.Fence, ref.Scope).Scan(&over, &secs); err != nil {
		return false, 0, err
	}
	return over, time.Duration(secs * float64(time.Second)), nil
}

// waitState is a checked key's: whether its attempt is over, and how long
// its lease has left.
type waitState struct {
	over bool
	left time.Duration
}

// checkAllWaited checks the keys ids (each with its fence and scope) in one
// statement on the main pool.
func (s *Store) checkAllWaited(ctx context.Context, ids, fences []int64, scopes []string) (map[int64]waitState, error) {
	sctx, cancel := context.WithTimeout(ctx, beginTimeout)
	defer cancel()
	rows, err := s.db.Query(sctx, s.q.waitCheckAll, ids, fences, scopes)
	if err != nil {
		return nil, err
	}
	out := make(map[int64]waitState, len(ids))
	for rows.Next() {
		var id int64
		var st waitState
		var secs float64
		if err := rows.Scan(&id, &st.over, &secs); err != nil {
			rows.Close()
			return nil, err
		}
		st.left = time.Duration(secs * float64(time.Second))
		out[id] = st
	}
	return out, rows.Err()
}

// listen holds the store's LISTEN connection until Close, connecting again
// after a failure; while it does not listen, watches poll. A failure is
// logged at warn, at most once per listenWarnEvery.
func (w *waits) listen() {
	defer w.wg.Done()
	for w.ctx.Err() == nil {
		ok, err := w.listenOnce()
		if !ok {
			w.unheard.Store(true)
			return
		}
		if w.ctx.Err() != nil {
			return
		}
		w.down.Store(true)
		w.warn(err)
		t := time.NewTimer(listenRetry)
		select {
		case <-w.ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// warn logs that the listener cannot listen, at most once per
// listenWarnEvery.
func (w *waits) warn(err error) {
	w.mu.Lock()
	now := time.Now()
	if !w.lastWarn.IsZero() && now.Sub(w.lastWarn) < listenWarnEvery {
		w.mu.Unlock()
		return
	}
	w.lastWarn = now
	w.mu.Unlock()
	w.log.Warn("pgstore: cannot LISTEN for finished keys; requests waiting for a key in flight poll until it can",
		"channel_table", w.st.q.leases, "error", err, "retry", listenRetry)
}

// listenOnce connects, LISTENs and receives notifications until the
// connection fails, and returns why; false when listening cannot work
// here (a pooler in transaction mode), so that the watches poll from then
// on.
func (w *waits) listenOnce() (bool, error) {
	ctx := w.ctx
	cctx, cancel := context.WithTimeout(ctx, schemaCheckTimeout)
	cfg := w.conn
	if w.beforeConnect != nil {
		cfg = w.conn.Copy()
		if err := w.beforeConnect(cctx, cfg); err != nil {
			cancel()
			return true, err
		}
	}
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		cancel()
		return true, err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	var backend uint32
	var schema *string
	err = conn.QueryRow(cctx, `SELECT pg_backend_pid(), (SELECT n.nspname::text FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1))`,
		pgx.QueryExecModeSimpleProtocol, w.st.q.leases).Scan(&backend, &schema)
	if err == nil && backend != conn.PgConn().PID() && !w.trusted {
		// A pooler hands this session's statements to any server
		// connection: a LISTEN would be lost with the next one.
		cancel()
		return false, nil
	}
	if err == nil && schema == nil {
		err = errors.New("no idem_leases table")
	}
	if err == nil {
		_, err = conn.Exec(cctx, "LISTEN "+pgx.Identifier{channel(*schema)}.Sanitize())
	}
	cancel()
	if err != nil {
		return true, err
	}
	w.listening.Store(true)
	w.down.Store(false)
	defer w.listening.Store(false)
	// Whatever finished before LISTEN took effect is looked at again.
	w.relisten()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true, err
		}
		w.notified.Add(1)
		if id, err := strconv.ParseInt(n.Payload, 10, 64); err == nil {
			w.wakeKey(id)
		}
	}
}

// close stops the listener, the checker and every mark, wakes every
// waiter (who acquire the key again, and find the store closed or the key
// as it is), and waits for the store's goroutines. Close may be called
// more than once.
func (w *waits) close() {
	w.mu.Lock()
	w.closed = true
	w.cancel()
	for _, wt := range w.watches {
		w.wakeLocked(wt)
	}
	w.mu.Unlock()
	w.wg.Wait()
}
