package sim

import (
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// nodeClock is a node's clockwork clock: the bubble's time plus the node's skew, with
// timers that fire through the loop, so that a paused node's timers fire only at its
// resume (a stopped process's do) and a slow node's fire late (CPU starvation).
// Durations are the simulation's: skew moves readings, not the rate.
type nodeClock struct {
	n *node
}

var _ clockwork.Clock = nodeClock{}

func (c nodeClock) Now() time.Time                  { return time.Now().Add(c.n.skew) }
func (c nodeClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c nodeClock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }
func (c nodeClock) Sleep(d time.Duration)           { <-c.After(d) }
func (c nodeClock) After(d time.Duration) <-chan time.Time {
	return c.NewTimer(d).Chan()
}

func (c nodeClock) NewTimer(d time.Duration) clockwork.Timer {
	t := &simTimer{n: c.n, ch: make(chan time.Time, 1), who: caller()}
	t.Reset(d)
	return t
}

func (c nodeClock) AfterFunc(d time.Duration, f func()) clockwork.Timer {
	t := &simTimer{n: c.n, fn: f, who: caller()}
	t.Reset(d)
	return t
}

func (c nodeClock) NewTicker(d time.Duration) clockwork.Ticker {
	t := &simTicker{simTimer: simTimer{n: c.n, ch: make(chan time.Time, 1), who: caller()}, period: d}
	t.simTimer.tick = func() {
		t.mu.Lock()
		p := t.period
		t.mu.Unlock()
		t.simTimer.Reset(p)
	}
	t.simTimer.Reset(d)
	return t
}

// simTimer fires through the loop: when its bubble timer goes off it submits the fire,
// and the loop delivers it now, or at its node's resume.
type simTimer struct {
	n    *node
	ch   chan time.Time // nil for an AfterFunc
	fn   func()
	tick func() // a ticker's re-arm, after each fire
	who  string // where it was made (caller): its fires' key, so that two fires at one
	// moment are handled in the same order in every replay

	mu     sync.Mutex
	gen    uint64 // a fire of an older generation (stopped or reset since) is dropped
	active bool
	inner  *time.Timer
}

func (t *simTimer) Chan() <-chan time.Time { return t.ch }

func (t *simTimer) Reset(d time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	was := t.active
	if t.inner != nil {
		t.inner.Stop()
	}
	t.gen++
	gen := t.gen
	t.active = true
	n := t.n
	t.inner = time.AfterFunc(max(d, 0), func() {
		// Alone: two fires delivered in one breath could find one select with both ready,
		// and Go picks one at random.
		n.s.submitAlone(n.name, "clock @"+t.who, func() { n.s.fireTimer(n, t, gen) })
	})
	return was
}

func (t *simTimer) Stop() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	was := t.active
	t.active = false
	t.gen++
	if t.inner != nil {
		t.inner.Stop()
	}
	return was
}

// fire delivers the fire of generation gen, if it is still the timer's.
func (t *simTimer) fire(gen uint64) {
	t.mu.Lock()
	if gen != t.gen || !t.active {
		t.mu.Unlock()
		return
	}
	t.active = false
	tick := t.tick
	t.mu.Unlock()
	if t.ch != nil {
		select {
		case t.ch <- time.Now().Add(t.n.skew):
		default: // a ticker's reader is behind: the tick is dropped, as time.Ticker drops it
		}
	} else {
		go t.fn()
	}
	if tick != nil {
		tick()
	}
}

// fireTimer delivers a timer's fire on the loop: late on a slow node, at the resume of
// a paused one.
func (s *Sim) fireTimer(n *node, t *simTimer, gen uint64) {
	if late := n.lateness(); late > 0 {
		s.after(late, func() { s.fireTimerNow(n, t, gen) })
		return
	}
	s.fireTimerNow(n, t, gen)
}

func (s *Sim) fireTimerNow(n *node, t *simTimer, gen uint64) {
	if n.paused {
		n.heldIn = append(n.heldIn, func() { t.fire(gen) })
		return
	}
	t.fire(gen)
}

type simTicker struct {
	simTimer
	period time.Duration // under simTimer.mu
}

func (t *simTicker) Reset(d time.Duration) {
	t.mu.Lock()
	t.period = d
	t.mu.Unlock()
	t.simTimer.Reset(d)
}

func (t *simTicker) Stop() { t.simTimer.Stop() }
