// Package backoff is flow's one implementation of capped exponential backoff with full
// jitter: election retries, lease re-acquire, log publish retries and step retries all
// wait with it.
package backoff

import (
	"context"
	"math/rand/v2"
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

// Delay is the wait before retry number attempt (0-based).
func (p Policy) Delay(attempt int) time.Duration {
	c := p.Ceiling(attempt)
	if p.NoJitter || c <= 0 {
		return c
	}
	return time.Duration(rand.Int64N(int64(c) + 1))
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
