package sim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flowrun/flow/internal/base/port"
)

// A node's ports: package port's interfaces, each call a request to the simulated server
// over the node's link. The calling goroutine submits it to the loop and blocks until
// the answer is delivered, its context ends, or (with no deadline of its own) the
// default timeout passes, as a JetStream request does: a request or an answer lost on
// the way is a timeout, and the outcome of a write that timed out is unknown.
//
// On the loop a call goes: sent (held while its node is paused; lost while it is
// partitioned, or by chance while faults last), arrives at the server after the link's
// delay, is handled there (a long poll waits there for what it asks or its wait), and
// its answer comes back the same way. A killed incarnation's calls are answered errDead
// at once (a closed connection: node.die), so that its goroutines, which a real SIGKILL
// would have ended, wind down while its engine is stopped; nothing they send arrives
// anywhere.

// defaultTimeout is a call's wait when its context has none (JetStream's default).
const defaultTimeout = 5 * time.Second

// errDead answers a killed incarnation's calls and ends its step processes: to the
// engine it is a closed connection (port.ErrClosed), as a dead process's would be.
var errDead = fmt.Errorf("sim: this node was killed: %w", port.ErrClosed)

type result struct {
	v   any
	err error
}

// pcall is one port call.
type pcall struct {
	n       *node
	inc     int
	label   string
	op      func(answer func(any, error)) // the server's handling, on the loop
	reply   chan result                   // cap 1
	timeout time.Duration                 // the loop answers with errTimeout then (0: never)
	done    bool                          // answered (the loop's)
	id      int                           // the order it was sent in (the loop's)
}

// endCalls answers every open call of n's incarnation inc with errDead, in the order
// they were sent: a killed incarnation's goroutines wind down at once.
func (s *Sim) endCalls(n *node, inc int) {
	var ended []*pcall
	for c := range s.open {
		if c.n == n && c.inc == inc {
			ended = append(ended, c)
		}
	}
	slices.SortFunc(ended, func(a, b *pcall) int { return cmp.Compare(a.id, b.id) })
	for _, c := range ended {
		s.deliverNow(c, result{err: fmt.Errorf("%s: %w", c.label, errDead)})
	}
}

// errTimeout is a call that got no answer in time: its outcome is unknown.
var errTimeout = errors.New("sim: no answer in time")

// nodePorts are one incarnation's ports.
type nodePorts struct {
	n   *node
	inc int
}

// start submits a call and returns it without waiting. The loop answers it with
// errTimeout after timeout (0: never) if nothing else answered it: the loop's own timer,
// so that a timeout is an event in its order, not a goroutine woken by the runtime.
func (p nodePorts) start(label string, data []byte, timeout time.Duration, op func(answer func(any, error))) *pcall {
	c := &pcall{n: p.n, inc: p.inc, label: label, op: op, reply: make(chan result, 1), timeout: timeout}
	key := label
	if len(data) > 0 {
		h := fnv.New64a()
		h.Write(data)
		key += "#" + strconv.FormatUint(h.Sum64(), 36)
	}
	// Who asks, by its code path: two goroutines of one node asking the same at the same
	// moment (a catch-up and the applier's probe) are told apart by where they ask from,
	// not by which the Go scheduler ran first.
	key += " @" + caller()
	p.n.s.submit(p.n.name, key, func() { p.n.s.send(c) })
	return c
}

// wait waits for c's answer, or until ctx ends.
func (c *pcall) wait(ctx context.Context) (any, error) {
	select {
	case r := <-c.reply:
		return r.v, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("sim: %s: %w", c.label, ctx.Err())
	}
}

// call makes a call and waits for its answer, at most defaultTimeout.
func (p nodePorts) call(ctx context.Context, label string, data []byte, op func(answer func(any, error))) (any, error) {
	if tag := port.CallTag(ctx); tag != "" {
		label += " [" + tag + "]"
	}
	return p.start(label, data, defaultTimeout, op).wait(ctx)
}

// do is call for a handling that answers at once.
func (p nodePorts) do(ctx context.Context, label string, data []byte, op func() (any, error)) (any, error) {
	return p.call(ctx, label, data, func(answer func(any, error)) { answer(op()) })
}

// send puts c on the wire (the loop).
func (s *Sim) send(c *pcall) {
	n := c.n
	if s.closing {
		s.deliverNow(c, result{err: fmt.Errorf("%s: %w", c.label, errDead)})
		return
	}
	s.calls++
	c.id = s.calls
	s.open[c] = struct{}{}
	dead := c.inc != n.inc || !n.alive
	if n.paused && !dead {
		n.heldOut = append(n.heldOut, c) // sent at the resume: its timeout runs from then
		return
	}
	if c.timeout > 0 {
		s.after(c.timeout, func() { s.timeOut(c) })
	}
	if dead {
		return // nothing a dead incarnation sends arrives: it only waits out its timeouts
	}
	if !s.link(n) || n.logCut && strings.HasPrefix(c.label, "log.") {
		return // lost on the way: the caller times out
	}
	s.after(s.delay(n), func() {
		if c.inc != n.inc {
			return // its node was killed meanwhile (it was answered then)
		}
		c.op(func(v any, err error) { s.respond(c, result{v, err}) })
	})
}

// respond sends the server's answer back over c's node's link.
func (s *Sim) respond(c *pcall, r result) {
	n := c.n
	if c.inc != n.inc || !s.link(n) || n.logCut && strings.HasPrefix(c.label, "log.") {
		return // lost on the way back, or its node was killed
	}
	s.after(s.delay(n)+n.lateness(), func() { s.deliver(c, r) })
}

// deliver hands the answer to the caller, unless its node is paused (then at the resume).
func (s *Sim) deliver(c *pcall, r result) {
	n := c.n
	if c.inc != n.inc {
		return
	}
	if n.paused {
		n.heldIn = append(n.heldIn, func() { s.deliver(c, r) })
		return
	}
	s.deliverNow(c, r)
}

// timeOut answers c with errTimeout if nothing else did: also a dead incarnation's, whose
// goroutines wind down on their timeouts.
func (s *Sim) timeOut(c *pcall) {
	r := result{err: fmt.Errorf("%s: %w", c.label, errTimeout)}
	if c.inc != c.n.inc {
		s.deliverNow(c, r)
		return
	}
	s.deliver(c, r)
}

func (s *Sim) deliverNow(c *pcall, r result) {
	if c.done {
		return
	}
	c.done = true
	delete(s.open, c)
	select {
	case c.reply <- r:
	default:
	}
}

// delay is how long a message takes on n's link: a fraction of a millisecond, and while
// faults last, sometimes a slow path of up to a TTL.
func (s *Sim) delay(n *node) time.Duration {
	d := 100*time.Microsecond + time.Duration(s.rng.Int64N(int64(2*time.Millisecond)))
	if s.faultOn && s.cfg.SlowP > 0 && s.rng.Float64() < s.cfg.SlowP {
		d += time.Duration(s.rng.Int64N(int64(s.cfg.TTL)))
	}
	return d
}

// link says whether a message on n's link (either way) gets through: not while n is
// partitioned, nor when it is lost.
func (s *Sim) link(n *node) bool {
	if n.partitioned || (s.faultOn && s.cfg.Loss > 0 && s.rng.Float64() < s.cfg.Loss) {
		s.stats.Lost++
		return false
	}
	return true
}

// caller names the code path of the goroutine that makes a call: a hash of its stack
// above this package.
func caller() string {
	var pcs [32]uintptr
	n := runtime.Callers(3, pcs[:])
	h := fnv.New64a()
	frames := runtime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		if !strings.Contains(f.Function, "engine/internal/sim.") {
			fmt.Fprintf(h, "%s:%d;", f.Function, f.Line)
		}
		if !more {
			break
		}
	}
	return strconv.FormatUint(h.Sum64(), 36)
}
