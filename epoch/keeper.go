package epoch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/flowrun/flow/internal/base/port"
)

// keeper renews one key (a term or a lease) and owns the goroutine that does it. It
// carries out the decisions of its Trust (trust.go): it sleeps until the next renewal is
// due or the trust window closes, renews, and fires the kill switch and the poison pill
// when the Trust says so. Every time it reads and every timer it sets is Config.Clock's.
type keeper struct {
	b           port.KV
	key         string
	value       []byte
	cfg         *Config
	clock       clockwork.Clock
	what        string // for messages: "term 57", "lease of run r1 at epoch 9"
	loseOnError bool   // any failed renewal ends it (terms); leases ride out timeouts as degraded
	onLost      func() // counts the loss, once, before the context is cancelled

	ctx    context.Context
	cancel context.CancelCauseFunc
	// loopCtx ends the renewal loop's calls when it is stopped (release).
	loopCtx    context.Context
	loopCancel context.CancelFunc

	rev atomic.Uint64

	// mu guards the holder's Trust, which the loop changes and Check, Degraded and
	// TrustDeadline read from other goroutines, and whether the loop has ended.
	mu struct {
		sync.Mutex
		trust   Trust
		stopped bool // the loop has ended: no longer degraded, whatever the last renewal did
	}

	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
	lostOnce sync.Once
	freeze   chan time.Duration // drills: stop everything for a while, as a paused process

	// parked, if set (tests only, before the goroutine starts), is told each time the
	// goroutine starts waiting on the clock, and until when, and (with the zero time)
	// when it stops waiting: the test signal that lets a test move a fake clock only
	// once the keeper has decided what it waits for.
	parked func(until time.Time)
}

func newKeeper(parent context.Context, b port.KV, key string, value []byte,
	rev uint64, sent time.Time, cfg *Config, what string, loseOnError bool, onLost func()) *keeper {
	k := makeKeeper(parent, b, key, value, rev, sent, cfg, what, loseOnError, onLost)
	go k.run()
	return k
}

// makeKeeper is newKeeper without starting the goroutine (tests start it themselves).
func makeKeeper(parent context.Context, b port.KV, key string, value []byte,
	rev uint64, sent time.Time, cfg *Config, what string, loseOnError bool, onLost func()) *keeper {
	k := &keeper{b: b, key: key, value: value, cfg: cfg, clock: cfg.Clock, what: what, loseOnError: loseOnError, onLost: onLost,
		stop: make(chan struct{}), done: make(chan struct{}), freeze: make(chan time.Duration, 1)}
	k.ctx, k.cancel = context.WithCancelCause(parent)
	k.loopCtx, k.loopCancel = context.WithCancel(k.ctx)
	k.rev.Store(rev)
	k.mu.trust = cfg.leaseClock().Begin(sent)
	return k
}

// never is what park reports when the goroutine waits for nothing on the clock.
var never = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// park tells a test that the goroutine waits on the clock until until (zero: it woke).
func (k *keeper) park(until time.Time) {
	if k.parked != nil {
		k.parked(until)
	}
}

func (k *keeper) trust() Trust {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.mu.trust
}

func (k *keeper) setTrust(f func(Trust) Trust) Trust {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.mu.trust = f(k.mu.trust)
	return k.mu.trust
}

// check is the local test before a write: is the trust window still open?
func (k *keeper) check() error {
	if err := context.Cause(k.ctx); err != nil {
		return err
	}
	if k.cfg.noKillSwitch() {
		return nil
	}
	if tr := k.trust(); !tr.Open(k.clock.Now()) {
		err := fmt.Errorf("%w: %s: no renewal succeeded within 2/3 of the TTL (%s)", ErrLeaseLost, k.what, tr.LeaseClock().TrustWindow())
		k.lose(err)
		return err
	}
	return nil
}

// trustDeadline is when check starts failing (zero without a kill switch), on the real
// clock: the Trust's deadline is on Config.Clock, and whoever holds this deadline (an
// exec step's init, another process) knows only the real one. With the real clock it is
// the Trust's deadline itself; with a fake one, the time left on it from now. The real
// clock is read first, so the two reads' distance can only make it earlier.
func (k *keeper) trustDeadline() time.Time {
	if k.cfg.noKillSwitch() {
		return time.Time{}
	}
	now := time.Now()
	return now.Add(k.trust().Deadline().Sub(k.clock.Now()))
}

func (k *keeper) lose(cause error) {
	k.lostOnce.Do(func() {
		if k.ctx.Err() != nil {
			return // released or resigned first
		}
		now := k.clock.Now()
		k.setTrust(func(t Trust) Trust { return t.Ended(now) })
		k.cfg.Logger.Warn("ownership lost", "what", k.what, "cause", cause)
		if k.onLost != nil {
			k.onLost()
		}
		k.cancel(cause)
	})
}

func (k *keeper) degraded() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return !k.mu.stopped && k.mu.trust.Degraded()
}

// renewed records a successful renewal sent at sent, and counts the time it was
// degraded, if it was.
func (k *keeper) renewed(sent time.Time) {
	now := k.clock.Now()
	k.setTrust(func(t Trust) Trust {
		if t.Degraded() {
			k.cfg.Counters.addDegraded(now.Sub(t.DegradedSince()))
		}
		return t.Renewed(sent)
	})
}

// stopped marks the loop ended and counts the degraded time it ends with.
func (k *keeper) stopped() {
	now := k.clock.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.mu.trust.Degraded() && !k.mu.stopped {
		k.cfg.Counters.addDegraded(now.Sub(k.mu.trust.DegradedSince()))
	}
	k.mu.stopped = true
}

func (k *keeper) run() {
	defer close(k.done)
	defer k.stopped()
	if k.cfg.noRenew() && k.cfg.noKillSwitch() {
		k.park(never)
		select { // negative control: never renews, never notices
		case <-k.stop:
		case <-k.ctx.Done():
		}
		return
	}
	wake := k.clock.NewTimer(time.Hour) // set by arm below
	defer wake.Stop()
	for {
		k.arm(wake)
		select {
		case d := <-k.freeze:
			t := k.clock.NewTimer(d) // a paused process: no renewal, no kill switch
			k.park(k.clock.Now().Add(d))
			select {
			case <-t.Chan():
			case <-k.stop:
				t.Stop()
				return
			}
			// On waking, the first thing is to notice the time (step, below).
		case <-k.stop:
			return
		case <-k.ctx.Done():
			k.poisonPill()
			return
		case <-wake.Chan():
		}
		k.park(time.Time{})
		select {
		case <-k.stop:
			return
		default:
		}
		if !k.step() {
			k.poisonPill()
			return
		}
	}
}

// arm sets wake to the next time the loop has something to do: the trust window's
// end (the kill switch) or the next renewal, whichever is first. A wake that comes
// early (a stale tick) is harmless: step acts on the time, not on the tick.
func (k *keeper) arm(wake clockwork.Timer) {
	now := k.clock.Now()
	tr := k.trust()
	if k.cfg.noKillSwitch() && !tr.Open(now) {
		// The negative control without a kill switch, past its window: nothing to do.
		wake.Stop()
		k.park(never)
		return
	}
	// With the kill switch on, a window already closed (a keeper that starts late: its
	// create took longer than the window to answer) fires at once.
	var at time.Time
	if !k.cfg.noKillSwitch() {
		at = tr.Deadline()
	}
	if !k.cfg.noRenew() && (at.IsZero() || tr.RenewAt().Before(at)) {
		at = tr.RenewAt()
	}
	wake.Reset(at.Sub(now))
	k.park(at)
}

// step does what is due now: the kill switch if the trust window has closed, a renewal
// if one is due. It reports false when the ownership is over.
func (k *keeper) step() bool {
	now := k.clock.Now()
	tr := k.trust()
	if k.cfg.noKillSwitch() {
		if !tr.Open(now) {
			return true // the negative control: the lapse goes unnoticed
		}
	} else if k.check() != nil {
		return false // the kill switch: check cancelled the context with the cause
	}
	if k.cfg.noRenew() || now.Before(tr.RenewAt()) {
		return true
	}
	if err := k.renew(); err != nil {
		if k.cfg.noKillSwitch() {
			return true // the negative control: the loss goes unnoticed
		}
		k.lose(err)
		return false
	}
	return k.cfg.noKillSwitch() || k.check() == nil
}

// poisonPill exits the process, with FastFail, at the Trust's PoisonAt (70% of the TTL
// since the last successful renewal was sent), unless the holder let go first (Release):
// for steps that do not stop when their context is cancelled. BeforeExit runs first (the
// engine kills its step processes' groups there).
func (k *keeper) poisonPill() {
	if !k.cfg.FastFail {
		return
	}
	at := k.trust().PoisonAt()
	t := k.clock.NewTimer(k.clock.Until(at))
	defer t.Stop()
	k.park(at)
	select {
	case <-k.stop:
	case <-t.Chan():
		k.cfg.Logger.Error("poison pill: no lease renewal by 70% of the TTL; exiting", "what", k.what)
		if k.cfg.BeforeExit != nil {
			// Before the exit, not after: what the process started must be dead before
			// the lease can move (at the TTL), and nothing runs after Exit.
			k.cfg.BeforeExit()
		}
		k.cfg.Exit(DefaultExitCode)
	}
}

// renew renews, retrying while renewals go unanswered (at the Trust's RetryAt), until
// one succeeds or the trust window closes (then the caller's check fires the kill
// switch). It returns an error only when the ownership is over.
func (k *keeper) renew() error {
	for {
		start := k.clock.Now()
		tr := k.trust()
		if !tr.Open(start) || k.loopCtx.Err() != nil {
			return nil
		}
		answered, err := k.renewOnce(start, tr)
		if err != nil || answered {
			return err
		}
		failed := k.clock.Now()
		if retry := tr.RetryAt(start, failed); retry.After(failed) { // failed fast (no responders): pace the retries
			t := k.clock.NewTimer(retry.Sub(failed))
			k.park(retry)
			select {
			case <-t.Chan():
			case <-k.loopCtx.Done():
			}
			t.Stop()
			k.park(time.Time{})
		}
	}
}

// renewOnce makes one renewal attempt sent at start. It reports answered when the
// attempt settled something (a success, the end of the ownership, or the loop
// stopping), and false when it went unanswered (degraded: try again).
func (k *keeper) renewOnce(start time.Time, tr Trust) (answered bool, err error) {
	// Never wait past the trust window: a renewal that answers later is useless.
	deadline := tr.AttemptDeadline(start)
	ctx, cancel := withClockDeadline(k.loopCtx, k.clock, deadline)
	defer cancel()
	k.park(deadline) // on the network, and at most until then
	rev, err := k.b.Update(ctx, k.key, k.value, k.rev.Load())
	if err != nil && isRevisionMismatch(err) && k.stillOurs(ctx) {
		// Either the revision did not move (on R3 an Update can fail with 10164 anyway),
		// or it moved to our own value: an earlier renewal that timed out here reached
		// the server after all. The key is still ours: retry at its revision.
		rev, err = k.b.Update(ctx, k.key, k.value, k.rev.Load())
	}
	k.park(time.Time{})
	if err == nil {
		k.rev.Store(rev)
		k.renewed(start)
		k.cfg.Counters.RenewalsOK.Add(1)
		return true, nil
	}
	k.cfg.Counters.RenewalsFailed.Add(1)
	switch {
	case k.loopCtx.Err() != nil:
		return true, nil // stopping
	case isRevisionMismatch(err), errors.Is(err, port.ErrKeyNotFound):
		return true, fmt.Errorf("%w: %s: the key moved on (lapsed or taken): %v", ErrLeaseLost, k.what, err)
	case k.loseOnError:
		return true, fmt.Errorf("%w: %s: renewal failed: %v", ErrLeaseLost, k.what, err)
	}
	// No answer in time: degraded, and try again; the kill switch ends it if this lasts.
	now := k.clock.Now()
	k.setTrust(func(t Trust) Trust { return t.Unanswered(now) })
	if cause := context.Cause(ctx); ctx.Err() != nil && cause != nil {
		err = fmt.Errorf("%w (%v)", err, cause)
	}
	k.cfg.Logger.Warn("renewal failed; degraded", "what", k.what, "err", err)
	return false, nil
}

// stillOurs reads the key through the stream leader and reports whether it still holds
// this holder's value (which names the owner and epoch or term, so no other holder
// writes the same bytes); if so it adopts the key's current revision.
func (k *keeper) stillOurs(ctx context.Context) bool {
	l, err := readLatest(ctx, k.b, k.key)
	if err != nil || !l.found || l.deleted || !bytes.Equal(l.value, k.value) || l.rev < k.rev.Load() {
		return false
	}
	k.rev.Store(l.rev)
	return true
}

// release stops renewing and, if still the holder, deletes the key at its revision so
// that the next owner need not wait for the TTL.
func (k *keeper) release(ctx context.Context, cause error) error {
	k.stopOnce.Do(func() { close(k.stop); k.loopCancel() })
	<-k.done
	stillHeld := k.check() == nil
	if k.ctx.Err() == nil {
		now := k.clock.Now()
		k.setTrust(func(t Trust) Trust { return t.Ended(now) })
	}
	k.cancel(cause)
	if !stillHeld {
		return nil
	}
	err := k.b.Delete(ctx, k.key, k.rev.Load())
	if err != nil && !isRevisionMismatch(err) {
		return fmt.Errorf("epoch: release %s: %w (it will lapse after the TTL)", k.what, err)
	}
	return nil
}

// withClockDeadline is context.WithDeadline on clk: the context ends, with cause
// context.DeadlineExceeded, when clk reaches deadline. (clockwork.WithDeadline's
// contexts block in Err until they end, and nats.go calls Err before each request.)
// The context reports no Deadline, so JetStream calls under it keep their own real-time
// default timeout as a backstop.
func withClockDeadline(parent context.Context, clk clockwork.Clock, deadline time.Time) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	t := clk.AfterFunc(clk.Until(deadline), func() { cancel(context.DeadlineExceeded) })
	return ctx, func() {
		t.Stop()
		cancel(context.Canceled)
	}
}

// sleep waits d on clk, or until ctx ends (and returns its error).
func sleep(ctx context.Context, clk clockwork.Clock, d time.Duration) error {
	t := clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.Chan():
		return nil
	}
}
