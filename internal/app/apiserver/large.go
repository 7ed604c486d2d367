package apiserver

import (
	"fmt"
	"sync"
	"time"

	"github.com/flowrun/flow/internal/base/bytelimit"
)

// Large requests. A request's body is decoded before anything can judge it,
// and a megabyte of JSON costs the node milliseconds: four callers sending 900 KB
// signals that the node then refused slowed every other user's runs 30-60x. So the bytes
// of large requests (over largeRequest) are bounded per user and node, before decoding:
// largeRate a second, in bursts of largeBurst; one more is refused with
// too_many_requests, and the refusal is held back until the user's allowance would have
// admitted it (at most largeHold): a caller that waits for its answer before sending
// again, as flowctl and the client do, sends at the allowed rate, not as fast as the node
// can say no (a refusal at once still let four such callers push 400 MB/s through NATS
// and slowed other users' runs 10x). Requests that name no user (no --auth) share one
// allowance. Small requests, every read and start among them, are not counted.
const (
	largeRequest = 64 << 10
	largeRate    = 1 << 20
	largeBurst   = 4 << 20
	largeHold    = 2 * time.Second
)

// largeLimiter bounds large requests' bytes per user (nil bytes: built on first use).
type largeLimiter struct {
	once  sync.Once
	bytes *bytelimit.Limiter
	off   bool // the test switch: no bound
}

// admit spends n bytes of who's allowance if n is large; refused, it says why and how
// long to hold the refusal back.
func (l *largeLimiter) admit(who, name string, n int) (why string, hold time.Duration, ok bool) {
	if n <= largeRequest || l.off {
		return "", 0, true
	}
	l.once.Do(func() { l.bytes = bytelimit.New(largeRate, largeBurst) })
	wait, ok := l.bytes.Take(who, n)
	if ok {
		return "", 0, true
	}
	hold = largeHold
	if wait > 0 {
		hold = min(wait, largeHold)
	}
	if name == "" {
		name = "callers without a name (no --auth)"
	}
	return fmt.Sprintf("too many large requests: %s sent more than %d bytes a second of requests over %d bytes to this node (bursts of %d), the most one user may: send smaller requests, or fewer",
		name, largeRate, largeRequest, largeBurst), hold, false
}
