package sim

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"github.com/flowrun/flow/epoch"
)

// holder is epoch's keeper carried out deterministically: it holds one key (a term or a
// run's lease) and takes every timing decision from epoch.Trust: it renews at RenewAt,
// gives an attempt up at AttemptDeadline, retries at RetryAt while degraded, and fires
// the kill switch when the trust window closes (Deadline) or a renewal is refused. Its
// timers are its node's events, so a paused node's holder acts late, on resume, and
// then sees the window closed.
type holder struct {
	n      *node
	bucket *bucket
	key    string
	value  []byte
	rev    uint64
	trust  epoch.Trust
	what   string
	// loseOnError: any failed renewal ends it (terms); a lease rides out timeouts as
	// degraded until its window closes.
	loseOnError  bool
	noKillSwitch bool
	ended        bool
	renewing     bool
	armed        int // generation of the wake timer
	onLost       func(cause error)
}

func newHolder(n *node, b *bucket, key string, value []byte, rev uint64, sent time.Time, what string, loseOnError bool, onLost func(error)) *holder {
	h := &holder{n: n, bucket: b, key: key, value: value, rev: rev, trust: n.s.lc.Begin(sent), what: what,
		loseOnError: loseOnError, onLost: onLost}
	if !loseOnError { // a lease: the lease's guards apply (terms take no hooks, as in flowd)
		h.noKillSwitch = n.s.cfg.Switches.hooks().NoKillSwitch
	}
	h.arm()
	return h
}

// check is the local test before a write (Lease.Check, Term.Check): the window is open.
func (h *holder) check() error {
	if h.ended {
		return fmt.Errorf("%w: %s ended", epoch.ErrLeaseLost, h.what)
	}
	if h.noKillSwitch {
		return nil
	}
	if !h.trust.Open(h.n.s.now) {
		err := fmt.Errorf("%w: %s: no renewal succeeded within the trust window", epoch.ErrLeaseLost, h.what)
		h.lose(err)
		return err
	}
	return nil
}

// deadline is when the step processes of this holder's work are killed by the
// containment watchdog: the trust deadline, as this node last moved it.
func (h *holder) deadline() time.Time { return h.trust.Deadline() }

func (h *holder) lose(cause error) {
	if h.ended {
		return
	}
	h.ended = true
	h.trust = h.trust.Ended(h.n.s.now)
	h.n.s.tracef(h.n.name, "%s lost: %v", h.what, cause)
	if h.onLost != nil {
		h.onLost(cause)
	}
}

// arm sets the wake-up: the kill switch at the deadline or the next renewal, whichever
// comes first.
func (h *holder) arm() {
	if h.ended {
		return
	}
	now := h.n.s.now
	var at time.Time
	if !h.noKillSwitch {
		at = h.trust.Deadline()
	} else if !h.trust.Open(now) {
		return // the control without a kill switch, past its window: nothing to do
	}
	if !h.renewing && (at.IsZero() || h.trust.RenewAt().Before(at)) {
		at = h.trust.RenewAt()
	}
	if at.IsZero() {
		return // no kill switch and a renewal in flight: its answer arms it again
	}
	h.armed++
	gen := h.armed
	h.n.on(at.Sub(now), func() {
		if gen == h.armed {
			h.step()
		}
	})
}

// step does what is due now (keeper.step).
func (h *holder) step() {
	if h.ended {
		return
	}
	now := h.n.s.now
	if h.noKillSwitch {
		if !h.trust.Open(now) {
			return
		}
	} else if h.check() != nil {
		h.n.s.stats.KillSwitches++
		return
	}
	if !h.renewing && !now.Before(h.trust.RenewAt()) {
		h.renew()
	}
	h.arm()
}

// renew makes one renewal attempt (keeper.renewOnce), and another while unanswered.
func (h *holder) renew() {
	start := h.n.s.now
	if !h.trust.Open(start) || h.ended {
		h.renewing = false
		return
	}
	h.renewing = true
	deadline := h.trust.AttemptDeadline(start)
	b, key, value, rev := h.bucket, h.key, h.value, h.rev
	h.n.call(deadline.Sub(start), func(reply func(any)) {
		r, err := b.update(key, value, rev)
		if err != nil && (errors.Is(err, errRevMismatch) || errors.Is(err, errKeyNotFound)) {
			// keeper.stillOurs: an earlier renewal that timed out may have landed: if the
			// key still holds our value, adopt its revision and renew at it.
			if l := b.latest(key); l.live && bytes.Equal(l.value, value) && l.rev >= rev {
				r, err = b.update(key, value, l.rev)
			}
		}
		reply(renewReply{rev: r, err: err})
	}, func(v any, err error) {
		if h.ended {
			return
		}
		if err == nil {
			rr := v.(renewReply)
			err = rr.err
			if err == nil {
				h.renewing = false
				h.rev = rr.rev
				h.trust = h.trust.Renewed(start)
				h.arm()
				return
			}
		}
		if !errors.Is(err, errTimeout) || h.loseOnError {
			h.renewing = false
			if h.noKillSwitch {
				return // the control: the loss goes unnoticed
			}
			h.lose(fmt.Errorf("%w: %s: renewal failed: %v", epoch.ErrLeaseLost, h.what, err))
			return
		}
		// Unanswered: degraded; try again at RetryAt while the window is open.
		now := h.n.s.now
		h.trust = h.trust.Unanswered(now)
		retry := h.trust.RetryAt(start, now)
		h.n.on(retry.Sub(now), func() {
			if !h.ended && h.renewing {
				h.renewing = false
				if h.trust.Open(h.n.s.now) {
					h.renew()
				}
				h.arm()
			}
		})
	})
}

type renewReply struct {
	rev uint64
	err error
}

// release stops renewing and deletes the key if it is still this holder's.
func (h *holder) release() {
	if h.ended {
		return
	}
	held := h.noKillSwitch || h.trust.Open(h.n.s.now)
	h.ended = true
	h.trust = h.trust.Ended(h.n.s.now)
	if !held {
		return
	}
	b, key, rev := h.bucket, h.key, h.rev
	h.n.call(time.Second, func(reply func(any)) { reply(b.deleteAt(key, rev)) }, func(any, error) {})
}
