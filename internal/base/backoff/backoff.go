// Package backoff is flow's one implementation of capped exponential backoff with full
// jitter: election retries, lease re-acquire, log publish retries and step retries all
// wait with it.
package backoff

import (
	"context"
	"time"
)

// Policy is min(Cap, Base·Multiplier^attempt), with full jitter: the wait is drawn
// uniformly from [0, that].
type Policy struct {
	Base       time.Duration // first ceiling; default 100ms
	Cap        time.Duration // largest ceiling; default 10s
	Multiplier float64       // growth per attempt; default 2
	// NoJitter returns the ceiling itself (step retries whose intervals users set).
	NoJitter bool
}

// Ceiling is the largest wait for attempt (0-based).
func (p Policy) Ceiling(attempt int) time.Duration {
	base, capd, mult := p.Base, p.Cap, p.Multiplier
	if base <= 0 {
		base = 100 * time.Millisecond
	}
	if capd <= 0 {
		capd = 10 * time.Second
	}
	if mult < 1 {
		mult = 2
	}
	d := float64(base)
	for i := 0; i < attempt && d < float64(capd); i++ {
		d *= mult
	}
	return time.Duration(min(d, float64(capd)))
}

// Delay is the wait before attempt: drawn from [0, Ceiling(attempt)] by a hash of the
// moment it is drawn (the clock's nanoseconds) and the ceiling. That spreads retries like
// a random draw (two nodes, or two retries, do not read the same nanosecond), and gives
// the same wait whenever the same moment comes again: the simulation
// (engine/internal/sim) runs the engines on a clock it moves itself, and replays a seed
// exactly only if nothing they do draws from a process-wide random source
// (docs/decisions.md, "Jitter from the clock").
func (p Policy) Delay(attempt int) time.Duration {
	c := p.Ceiling(attempt)
	if p.NoJitter || c <= 0 {
		return c
	}
	return time.Duration(mix(uint64(time.Now().UnixNano())^uint64(c)*0x9e3779b97f4a7c15) % (uint64(c) + 1))
}

// mix is splitmix64's finalizer: every bit of x moves every bit of the result.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Sleep waits Delay(attempt) or until ctx ends, and returns ctx's error if it ended.
func (p Policy) Sleep(ctx context.Context, attempt int) error {
	t := time.NewTimer(p.Delay(attempt))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
