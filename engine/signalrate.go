package engine

import (
	"errors"
	"fmt"

	"github.com/flowrun/flow/internal/base/bytelimit"
)

// ErrTooMuchSignalData: a person sent more signal data to this node than its per-person
// rate allows. The API answers it as too_many_requests.
var ErrTooMuchSignalData = errors.New("engine: too much signal data")

// Signal data per person per node. A run's inbox is bounded in bytes, and a
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

func newSignalLimiter() *bytelimit.Limiter { return bytelimit.New(signalRate, signalBurst) }

// takeSignalBytes spends n bytes of who's signal allowance, or refuses them.
func (e *Engine) takeSignalBytes(who string, n int) error {
	if _, ok := e.signalBytes.Take(who, n); ok {
		return nil
	}
	name := who
	if name == "" {
		name = "anonymous callers (no --auth)"
	}
	return fmt.Errorf("%w: %s sent more than %d bytes of signal data a second to this node (bursts of %d), the most one person may: send less, or smaller signals",
		ErrTooMuchSignalData, name, signalRate, signalBurst)
}
