package bytelimit

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limiter holds each key's allowance. The zero value is not usable: use New.
type Limiter struct {
	perSecond, burst int
	mu               sync.Mutex
	now              func() time.Time
	per              map[string]*allowance
	seen             time.Time // when idle allowances were last dropped
}

type allowance struct {
	lim  *rate.Limiter
	used time.Time
}

// New is a limiter of perSecond bytes a second per key, in bursts of burst.
func New(perSecond, burst int) *Limiter {
	return &Limiter{perSecond: perSecond, burst: burst, now: time.Now, per: map[string]*allowance{}}
}

// SetClock replaces the clock (tests).
func (l *Limiter) SetClock(now func() time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.now = now
}

// Take spends n bytes of key's allowance. Refused (nothing spent), it says how long
// until the allowance would have admitted them (wait; 0 when it never would: n is more
// than a burst).
func (l *Limiter) Take(key string, n int) (wait time.Duration, ok bool) {
	if n <= 0 {
		return 0, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if now.Sub(l.seen) > time.Minute {
		for k, a := range l.per {
			if now.Sub(a.used) > time.Minute {
				delete(l.per, k)
			}
		}
		l.seen = now
	}
	a := l.per[key]
	if a == nil {
		a = &allowance{lim: rate.NewLimiter(rate.Limit(l.perSecond), l.burst)}
		l.per[key] = a
	}
	a.used = now
	r := a.lim.ReserveN(now, n)
	if !r.OK() {
		return 0, false
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return d, false
	}
	return 0, true
}

// Keys is how many keys the limiter holds (tests).
func (l *Limiter) Keys() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.per)
}
