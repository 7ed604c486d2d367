package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/flowrun/flow/steps"
)

// The step kind the simulated workflows use: each attempt is a process of the world's,
// as an exec step's is: it takes a random time, does its side effect (a payment) at a
// random moment of it, and fails with the workload's probability. It is not paused with
// its node (a process is not stopped when flowd is), it dies with its node, with its
// epoch (its context: the worker's kill switch, a cancel) and, while its node cannot
// act, at its lease's trust deadline by its containment watchdog, as an exec step's
// init stops it (steps/contain.go): the deadline is the one its node last moved.

const simStepKind = "sim"

// errStepFailed is a process's own failure (retried by the step's policy).
var errStepFailed = errors.New("sim: the step failed")

type proc struct {
	n     *node
	inc   int
	in    steps.Input
	key   string
	alive bool
	reply chan result
}

// stepKind is the step kind of one incarnation of n.
func (n *node) stepKind(inc int) steps.Step {
	return steps.Func(func(ctx context.Context, in steps.Input) (json.RawMessage, error) {
		p := &proc{n: n, inc: inc, in: in, reply: make(chan result, 1),
			key: fmt.Sprintf("proc %s/%s[%d] epoch=%d attempt=%d", in.Run, in.Step, in.Item, in.Epoch, in.Attempt)}
		n.s.submit(n.name, p.key, func() { n.s.startProc(p) })
		select {
		case r := <-p.reply:
			if r.err != nil {
				return nil, r.err
			}
			return r.v.(json.RawMessage), nil
		case <-ctx.Done():
			// The process is stopped before anything else happens in the world: the loop
			// takes this at the same moment.
			n.s.submit(n.name, p.key+" stop", func() { n.s.endProc(p, context.Cause(ctx)) })
			return nil, context.Cause(ctx)
		}
	})
}

// holdsKey is the account a process of a keyed or slotted run holds ("" if none).
func (s *Sim) holdsKey(in steps.Input) string {
	if step, slotted := s.keyStep[in.Run]; slotted && step != in.Step {
		return ""
	}
	return s.keyOf[in.Run]
}

func (s *Sim) startProc(p *proc) {
	n := p.n
	if p.inc != n.inc || !n.alive {
		p.reply <- result{err: errDead}
		return
	}
	if key := s.holdsKey(p.in); key != "" {
		// Invariant "key": no other run of the key has a process alive now, on any node
		// (a paused node's processes run on until their watchdog stops them). A slotted
		// run holds its account only in its keyed step.
		for _, m := range s.nodes {
			for q := range m.procs {
				if q.alive && q.in.Run != p.in.Run && s.holdsKey(q.in) == key {
					s.fail("key", "%s starts while %s of the same key runs (%s)", p.key, q.key, key)
				}
			}
		}
	}
	if s.finRuns[p.in.Run] {
		// Invariant "label": a run that needs the finance label runs every step on a
		// node that has it.
		if !slices.Contains(n.labels(), "finance") {
			s.fail("label", "%s starts on %s, which has no finance label (runs_on: [finance])", p.key, n.name)
		}
		s.stats.LabelledSteps++
	}
	if s.walletRuns[p.in.Run] && p.in.Step == "pay" {
		s.payStarted()
	}
	p.alive = true
	n.procs[p] = struct{}{}
	d := 10*time.Millisecond + time.Duration(s.rng.Int64N(int64(s.cfg.StepMax)))
	effect := time.Duration(s.rng.Int64N(int64(d)))
	failed := s.cfg.StepFail > 0 && s.rng.Float64() < s.cfg.StepFail
	s.after(effect, func() {
		if p.alive {
			s.sideEffect(n, p)
		}
	})
	s.after(d, func() {
		if !p.alive {
			return
		}
		if failed {
			s.endProc(p, errStepFailed)
			return
		}
		s.endProc(p, nil)
	})
	if !s.cfg.Switches.NoWatchdog && p.in.TrustUntil != nil {
		s.watchdog(p)
	}
}

// watchdog stops p at its lease's trust deadline unless a renewal moved it meanwhile.
func (s *Sim) watchdog(p *proc) {
	dl := p.in.TrustUntil()
	if dl.IsZero() {
		return
	}
	s.at(dl, func() {
		if !p.alive {
			return
		}
		if now := p.in.TrustUntil(); now.After(s.now) {
			s.watchdog(p)
			return
		}
		s.stats.Watchdogs++
		s.tracef(p.n.name, "watchdog stops %s", p.key)
		s.endProc(p, steps.ErrTrustDeadline)
	})
}

// endProc ends p: it does nothing more; its step learns err (nil: it succeeded).
func (s *Sim) endProc(p *proc, err error) {
	if !p.alive {
		return
	}
	p.alive = false
	delete(p.n.procs, p)
	r := result{err: err}
	if err == nil {
		r.v = json.RawMessage(fmt.Sprintf(`{"paid":%q}`, p.in.IdempotencyKey))
	}
	select {
	case p.reply <- r:
	default:
	}
}

// sideEffect is a process's side effect, done at that moment by its epoch: invariants 8
// and 3 are checked against the whole log appended so far.
func (s *Sim) sideEffect(n *node, p *proc) {
	s.stats.SideEffects++
	s.tracef(n.name, "side effect %s/%s[%d] by epoch %d", p.in.Run, p.in.Step, p.in.Item, p.in.Epoch)
	if err := s.check.SideEffect(p.in.Run, p.in.Step, p.in.Item, p.in.Epoch); err != nil {
		s.failErr(err)
	}
}

// payStarted counts a rate-limited start now. Invariant "rate": within any second, at
// most the rate's limit + 1 + limit·slack/per starts (engine/internal/rates: 1.1·limit
// + 1), whichever nodes made them and whatever their clocks say.
func (s *Sim) payStarted() {
	s.payStarts = append(s.payStarts, s.now)
	s.stats.PaySteps++
	n := 0
	for _, at := range s.payStarts {
		if s.now.Sub(at) < time.Second {
			n++
		}
	}
	if bound := walletLimit + 1 + walletLimit/10; n > bound {
		s.fail("rate", "%d pay starts within a second; the wallet's rate allows %d (limit %d/s)", n, bound, walletLimit)
	}
}
