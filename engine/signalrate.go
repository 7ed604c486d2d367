package engine

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// ErrTooMuchSignalData: a person sent more signal data to this node than its per-person
// rate allows. The API answers it as too_many_requests.
var ErrTooMuchSignalData = errors.New("engine: too much signal data")

// Signal data per person per node (issue 36). A run's inbox is bounded in bytes, and a
// signal past the bound is refused before the log; but each large signal still costs its
// sender's node the decoding and the checks of a megabyte, and four senders of 900 KB
// signals slowed another user's runs 5x with every one refused. A person may send
// signalRate bytes of signal data a second to a node, in bursts of signalBurst (one
// signal of up to a run's whole inbox): far beyond what a person or a script signalling
// runs needs (100,000 runs signalled at 4,541 signals/s with small data are 100 KB/s).
// People the server names no one (no --auth) share one allowance.
const (
	signalRate  = 1 << 20
	signalBurst = 2 << 20
)

// signalLimiter holds each person's allowance; idle ones are dropped.
type signalLimiter struct {
	mu   sync.Mutex
	now  func() time.Time
	per  map[string]*personRate
	seen time.Time // when idle allowances were last dropped
}

type personRate struct {
	lim  *rate.Limiter
	used time.Time
}

// take spends n bytes of who's allowance, or refuses them (nothing spent).
func (l *signalLimiter) take(who string, n int) error {
	if n == 0 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.now != nil {
		now = l.now()
	}
	if l.per == nil {
		l.per = map[string]*personRate{}
	}
	if now.Sub(l.seen) > time.Minute {
		for k, p := range l.per {
			if now.Sub(p.used) > time.Minute { // a full allowance again: nothing to keep
				delete(l.per, k)
			}
		}
		l.seen = now
	}
	p := l.per[who]
	if p == nil {
		p = &personRate{lim: rate.NewLimiter(rate.Limit(signalRate), signalBurst)}
		l.per[who] = p
	}
	p.used = now
	if !p.lim.AllowN(now, n) {
		name := who
		if name == "" {
			name = "anonymous callers (no --auth)"
		}
		return fmt.Errorf("%w: %s sent more than %d bytes of signal data a second to this node (bursts of %d), the most one person may: send less, or smaller signals",
			ErrTooMuchSignalData, name, signalRate, signalBurst)
	}
	return nil
}
