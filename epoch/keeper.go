package epoch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// keeper renews one key (a term or a lease) and owns the goroutine that does it.
//
// Its trust window ends trust after the *send* time of the last successful renewal, on
// the monotonic clock: the server's TTL for that renewal started later, so the holder
// always stops believing before the server lets anyone else in.
type keeper struct {
	js          jetstream.JetStream
	kv          jetstream.KeyValue
	key         string
	value       []byte
	cfg         *Config
	what        string // for messages: "term 57", "lease of run r1 at epoch 9"
	loseOnError bool   // any failed renewal ends it (terms); leases ride out timeouts as degraded
	onLost      func() // counts the loss, once, before the context is cancelled

	ctx    context.Context
	cancel context.CancelCauseFunc
	// loopCtx ends the renewal loop's calls when it is stopped (release).
	loopCtx    context.Context
	loopCancel context.CancelFunc
	base       time.Time // monotonic origin of trustUntil and lastSent

	rev        atomic.Uint64
	trustUntil atomic.Int64 // since base
	lastSent   atomic.Int64 // since base: send time of the last successful renewal

	mu struct {
		sync.Mutex
		degradedSince time.Time // zero when not degraded
	}

	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
	lostOnce sync.Once
	freeze   chan time.Duration // drills: stop everything for a while, as a paused process
}

func newKeeper(parent context.Context, js jetstream.JetStream, kv jetstream.KeyValue, key string, value []byte,
	rev uint64, sent time.Time, cfg *Config, what string, loseOnError bool, onLost func()) *keeper {
	k := &keeper{js: js, kv: kv, key: key, value: value, cfg: cfg, what: what, loseOnError: loseOnError, onLost: onLost,
		base: sent, stop: make(chan struct{}), done: make(chan struct{}), freeze: make(chan time.Duration, 1)}
	k.ctx, k.cancel = context.WithCancelCause(parent)
	k.loopCtx, k.loopCancel = context.WithCancel(k.ctx)
	k.rev.Store(rev)
	k.trustUntil.Store(int64(cfg.trust()))
	go k.run()
	return k
}

func (k *keeper) since() time.Duration { return time.Since(k.base) }

// check is the local test before a write: is the trust window still open?
func (k *keeper) check() error {
	if err := context.Cause(k.ctx); err != nil {
		return err
	}
	if k.cfg.noKillSwitch() {
		return nil
	}
	if k.since() >= time.Duration(k.trustUntil.Load()) {
		err := fmt.Errorf("%w: %s: no renewal succeeded within 2/3 of the TTL (%s)", ErrLeaseLost, k.what, k.cfg.trust())
		k.lose(err)
		return err
	}
	return nil
}

// trustDeadline is when check starts failing (zero without a kill switch).
func (k *keeper) trustDeadline() time.Time {
	if k.cfg.noKillSwitch() {
		return time.Time{}
	}
	return k.base.Add(time.Duration(k.trustUntil.Load()))
}

func (k *keeper) lose(cause error) {
	k.lostOnce.Do(func() {
		if k.ctx.Err() != nil {
			return // released or resigned first
		}
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
	return !k.mu.degradedSince.IsZero()
}

func (k *keeper) setDegraded(on bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case on && k.mu.degradedSince.IsZero():
		k.mu.degradedSince = time.Now()
	case !on && !k.mu.degradedSince.IsZero():
		k.cfg.Counters.addDegraded(time.Since(k.mu.degradedSince))
		k.mu.degradedSince = time.Time{}
	}
}

func (k *keeper) run() {
	defer close(k.done)
	defer k.setDegraded(false)
	if k.cfg.noRenew() && k.cfg.noKillSwitch() {
		select { // negative control: never renews, never notices
		case <-k.stop:
		case <-k.ctx.Done():
		}
		return
	}
	tick := time.NewTicker(k.cfg.RenewInterval)
	defer tick.Stop()
	renewals := tick.C
	if k.cfg.noRenew() {
		renewals = nil // the kill switch alone: the lease lapses and the watchdog notices
	}
	watchdog := time.NewTimer(k.cfg.trust())
	defer watchdog.Stop()
	watchdogC := watchdog.C
	if k.cfg.noKillSwitch() {
		watchdogC = nil // renewals alone: a lapse goes unnoticed (negative control)
	}
	for {
		select {
		case d := <-k.freeze:
			t := time.NewTimer(d) // a paused process: no renewal, no watchdog
			select {
			case <-t.C:
			case <-k.stop:
				t.Stop()
				return
			}
			watchdog.Reset(0) // on waking, the first thing is to notice the time
		case <-k.stop:
			return
		case <-k.ctx.Done():
			k.poisonPill()
			return
		case <-watchdogC:
			_ = k.check() // cancels with the cause when the window has passed
			if k.ctx.Err() != nil {
				k.poisonPill()
				return
			}
			watchdog.Reset(time.Duration(k.trustUntil.Load()) - k.since())
		case <-renewals:
			if err := k.renew(); err != nil {
				if k.cfg.noKillSwitch() {
					continue // the negative control: the loss goes unnoticed
				}
				k.lose(err)
				k.poisonPill()
				return
			}
			watchdog.Reset(time.Duration(k.trustUntil.Load()) - k.since())
		}
	}
}

// poisonPill exits the process, with FastFail, once 70% of the TTL has passed since
// the last successful renewal was sent, unless the holder let go first (Release): for
// steps that do not stop when their context is cancelled. BeforeExit runs first (the
// engine kills its step processes' groups there).
func (k *keeper) poisonPill() {
	if !k.cfg.FastFail {
		return
	}
	wait := time.Duration(k.lastSent.Load()) + k.cfg.poison() - k.since()
	t := time.NewTimer(max(wait, 0))
	defer t.Stop()
	select {
	case <-k.stop:
	case <-t.C:
		k.cfg.Logger.Error("poison pill: no lease renewal by 70% of the TTL; exiting", "what", k.what)
		if k.cfg.BeforeExit != nil {
			// Before the exit, not after: what the process started must be dead before
			// the lease can move (at the TTL), and nothing runs after Exit.
			k.cfg.BeforeExit()
		}
		k.cfg.Exit(DefaultExitCode)
	}
}

// renew renews, retrying at once while renewals go unanswered, until one succeeds or
// the trust window ends (then the watchdog ends the ownership). It returns an error
// only when the ownership is over.
func (k *keeper) renew() error {
	for k.since() < time.Duration(k.trustUntil.Load()) {
		retry, err := k.renewOnce()
		if err != nil || !retry {
			return err
		}
		if k.loopCtx.Err() != nil {
			return nil
		}
	}
	return nil
}

func (k *keeper) renewOnce() (retry bool, err error) {
	sent := time.Now()
	// Never wait past the trust window: a renewal that answers later is useless.
	deadline := sent.Add(k.cfg.renewalTimeout())
	if end := k.base.Add(time.Duration(k.trustUntil.Load())); end.Before(deadline) {
		deadline = end
	}
	ctx, cancel := context.WithDeadline(k.loopCtx, deadline)
	defer cancel()
	rev, err := k.kv.Update(ctx, k.key, k.value, k.rev.Load())
	if err != nil && isRevisionMismatch(err) && k.stillOurs(ctx) {
		// Either the revision did not move (on R3 an Update can fail with 10164 anyway),
		// or it moved to our own value: an earlier renewal that timed out here reached
		// the server after all. The key is still ours: retry at its revision.
		rev, err = k.kv.Update(ctx, k.key, k.value, k.rev.Load())
	}
	if err == nil {
		k.rev.Store(rev)
		off := sent.Sub(k.base)
		k.lastSent.Store(int64(off))
		k.trustUntil.Store(int64(off + k.cfg.trust()))
		k.setDegraded(false)
		k.cfg.Counters.RenewalsOK.Add(1)
		return false, nil
	}
	k.cfg.Counters.RenewalsFailed.Add(1)
	switch {
	case k.loopCtx.Err() != nil:
		return false, nil // stopping
	case isRevisionMismatch(err), errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return false, fmt.Errorf("%w: %s: the key moved on (lapsed or taken): %v", ErrLeaseLost, k.what, err)
	case k.loseOnError:
		return false, fmt.Errorf("%w: %s: renewal failed: %v", ErrLeaseLost, k.what, err)
	}
	// No answer in time: degraded, and try again; the watchdog ends it if this lasts.
	k.setDegraded(true)
	k.cfg.Logger.Warn("renewal failed; degraded", "what", k.what, "err", err)
	if wait := time.Until(deadline); wait > 0 { // failed fast (no responders): pace the retries
		t := time.NewTimer(min(wait, k.cfg.renewalTimeout()/4))
		select {
		case <-t.C:
		case <-k.loopCtx.Done():
		}
		t.Stop()
	}
	return true, nil
}

// stillOurs reads the key through the stream leader and reports whether it still holds
// this holder's value (which names the owner and epoch or term, so no other holder
// writes the same bytes); if so it adopts the key's current revision.
func (k *keeper) stillOurs(ctx context.Context) bool {
	l, err := readLatest(ctx, k.js, bucketOf(k.kv), k.key)
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
	k.cancel(cause)
	if !stillHeld {
		return nil
	}
	err := k.kv.Delete(ctx, k.key, jetstream.LastRevision(k.rev.Load()))
	if err != nil && !isRevisionMismatch(err) {
		return fmt.Errorf("epoch: release %s: %w (it will lapse after the TTL)", k.what, err)
	}
	return nil
}

func bucketOf(kv jetstream.KeyValue) string { return kv.Bucket() }
