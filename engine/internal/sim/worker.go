package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/worker"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/workflow"
)

// pool is a node's workers (engine/internal/worker's Pool), carried out
// deterministically: it fetches a task while a slot is free and no lease is degraded,
// judges it (worker.JudgeTask), takes the run's lease for the task's epoch, claims the
// epoch, and runs the DAG (worker.ReadySteps, worker.DecideEnd). Each step attempt is a
// process of its own that takes a random time, does its side effect at a random moment
// of it, and dies at its lease's trust deadline (the containment watchdog) or with its
// node.
type pool struct {
	n        *node
	free     int
	fetching bool
	stopping bool // draining: no new task, every run handed back
	runs     map[string]*runExec
}

var (
	errStolen   = errors.New(worker.ReasonStolen)
	errRunEnded = worker.ErrRunEnded
)

func newPool(n *node) *pool {
	return &pool{n: n, free: n.s.cfg.Slots, runs: map[string]*runExec{}}
}

func (p *pool) start() { p.fetch() }

// degraded: a lease this node holds goes unrenewed; it takes no new task.
func (p *pool) degraded() bool {
	for _, id := range p.sortedRuns() {
		if p.runs[id].lease.trust.Degraded() && !p.runs[id].lease.ended {
			return true
		}
	}
	return false
}

func (p *pool) sortedRuns() []string {
	ids := make([]string, 0, len(p.runs))
	for id := range p.runs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// fetch is the fetch loop: one fetch in flight while a slot is free.
func (p *pool) fetch() {
	n := p.n
	if p.fetching || p.free == 0 || p.stopping {
		return
	}
	if p.degraded() {
		n.on(50*time.Millisecond, p.fetch)
		return
	}
	p.fetching = true
	q := n.s.srv.tasks
	n.call(pollWait+time.Second, func(reply func(any)) { q.fetch(pollWait, reply) }, func(v any, err error) {
		p.fetching = false
		if err != nil {
			n.on(backoffDelay(n.s, 3, 50*time.Millisecond, time.Second), p.fetch)
			return
		}
		if d, ok := v.(taskDelivery); ok {
			p.free--
			p.handleTask(d)
		}
		p.fetch()
	})
}

func (p *pool) slotFree() {
	p.free++
	p.fetch()
}

func (p *pool) ack(d taskDelivery) {
	q := p.n.s.srv.tasks
	p.n.call(time.Second, func(reply func(any)) { q.ack(d.id); reply(nil) }, func(any, error) {})
}

// nak puts the task back for a quarter of the TTL (Pool.retryDelay).
func (p *pool) nak(d taskDelivery) {
	q := p.n.s.srv.tasks
	delay := max(p.n.s.cfg.TTL/4, 50*time.Millisecond)
	p.n.call(time.Second, func(reply func(any)) { q.nak(d.id, delay); reply(nil) }, func(any, error) {})
}

func (p *pool) read(id string) *checkpoint.Run {
	r, err := p.n.store.Run(id)
	if err != nil {
		return nil
	}
	return r
}

// handleTask takes a task (Pool.handleTask).
func (p *pool) handleTask(d taskDelivery) {
	n := p.n
	t := d.task
	n.s.tracef(n.name, "task %s epoch %d", t.Run, t.Epoch)
	deadline := n.s.now.Add(5 * time.Second)
	var judge func()
	judge = func() {
		switch worker.JudgeTask(p.read(t.Run), t) {
		case worker.TaskNotYet:
			if !n.s.now.Before(deadline) {
				p.nak(d)
				p.slotFree()
				return
			}
			// Look again when this node applies more, or at the deadline.
			fired := false
			again := func() {
				if !fired {
					fired = true
					judge()
				}
			}
			n.onChange(again)
			n.on(deadline.Sub(n.s.now), again)
		case worker.TaskStale:
			p.ack(d)
			p.slotFree()
		case worker.TaskTake:
			p.acquire(t.Run, t.Epoch, func(h *holder, err error) {
				if err != nil {
					n.s.tracef(n.name, "task %s epoch %d not taken: %v", t.Run, t.Epoch, err)
					p.nak(d)
					p.slotFree()
					return
				}
				p.claim(d, h)
			})
		}
	}
	judge()
}

var errLeaseHeld = errors.New("epoch: lease held by another owner")

// acquire takes the run's lease for the epoch (Leases.Acquire): Create; on a key that
// exists, adopt it if it is ours, give up if a newer or equal epoch holds it, and try
// again with backoff while an older one has not lapsed, for up to 2 TTL.
func (p *pool) acquire(run string, ep int64, done func(*holder, error)) {
	n := p.n
	val, _ := json.Marshal(epoch.LeaseValue{Run: run, Epoch: ep, Owner: n.name})
	b := n.s.srv.kv[leaseBucket]
	giveUp := n.s.now.Add(2 * n.s.cfg.TTL)
	what := fmt.Sprintf("lease of %s epoch %d", run, ep)
	var try func(attempt int)
	try = func(attempt int) {
		sent := n.s.now
		n.call(time.Second, func(reply func(any)) {
			rev, err := b.create(run, val)
			if err == nil {
				reply(acquireReply{rev: rev})
				return
			}
			l := b.latest(run)
			if !l.live {
				reply(acquireReply{err: err}) // lapsed meanwhile: try again
				return
			}
			var held epoch.LeaseValue
			_ = json.Unmarshal(l.value, &held)
			switch {
			case string(l.value) == string(val):
				rev, err := b.update(run, val, l.rev) // ours already (a retried acquire): adopt it
				reply(acquireReply{rev: rev, err: err})
			case held.Epoch >= ep:
				reply(acquireReply{err: fmt.Errorf("%w: %s holds epoch %d", errLeaseHeld, held.Owner, held.Epoch)})
			default:
				reply(acquireReply{err: err})
			}
		}, func(v any, err error) {
			if err == nil {
				ar := v.(acquireReply)
				if ar.err == nil {
					var h *holder
					h = newHolder(n, b, run, val, ar.rev, sent, what, false, func(cause error) {
						if x := p.runs[run]; x != nil && x.lease == h {
							x.leaseLost(cause)
						}
					})
					done(h, nil)
					return
				}
				err = ar.err
			}
			if errors.Is(err, errLeaseHeld) || !n.s.now.Before(giveUp) {
				done(nil, err)
				return
			}
			n.on(backoffDelay(n.s, min(attempt, 8), 50*time.Millisecond, 2*time.Second), func() { try(attempt + 1) })
		})
	}
	try(0)
}

type acquireReply struct {
	rev uint64
	err error
}

// claim writes the claim of the epoch; accepted, the task is acked and the epoch runs.
func (p *pool) claim(d taskDelivery, h *holder) {
	n := p.n
	t := d.task
	n.write([]checkpoint.Entry{{Kind: checkpoint.KindClaim, Run: t.Run, Epoch: t.Epoch, Owner: n.name}}, func(_ uint64, errs []error) {
		if err := errs[0]; err != nil {
			h.release()
			if errors.Is(err, checkpoint.ErrFenced) || worker.IsVerdict(err) {
				p.ack(d) // the log said no: this task's epoch will not run
			} else {
				p.nak(d) // unknown: if it landed, the task comes back stale
			}
			p.slotFree()
			return
		}
		p.ack(d)
		p.execute(t.Run, t.Epoch, h)
	})
}

// drain hands every run back (Pool.Drain) and reports when none is left.
func (p *pool) drain(done func()) {
	p.stopping = true
	for _, id := range p.sortedRuns() {
		p.runs[id].cancel(worker.ErrDrain)
	}
	deadline := p.n.s.now.Add(5 * time.Second)
	var wait func()
	wait = func() {
		if (len(p.runs) == 0 && p.free == p.n.s.cfg.Slots) || !p.n.s.now.Before(deadline) {
			done()
			return
		}
		p.n.on(50*time.Millisecond, wait)
	}
	wait()
}

// killAll kills every step process of this node (the node dies with them).
func (p *pool) killAll() {
	for _, id := range p.sortedRuns() {
		for _, pr := range p.runs[id].procs {
			pr.alive = false
		}
	}
}

// runEnded stops the execution of a run the log ended from outside (Pool.RunEnded).
func (p *pool) runEnded(run string, status checkpoint.RunStatus) {
	if status != checkpoint.StatusCancelled && status != checkpoint.StatusDeadLettered {
		return
	}
	if x := p.runs[run]; x != nil {
		p.n.on(0, func() { x.end(fmt.Errorf("%w: %s", errRunEnded, status)) })
	}
}

func (p *pool) execute(run string, ep int64, h *holder) {
	n := p.n
	r, err := n.store.Run(run)
	var wf *workflow.Workflow
	if err == nil {
		wf, err = n.specs.OfRun(r)
	}
	if err != nil {
		n.s.fail("sim", "%s: cannot run %s: %v", n.name, run, err)
		return
	}
	x := &runExec{p: p, run: r, wf: wf, epoch: ep, lease: h, done: map[string]bool{}, active: map[string]bool{}}
	p.runs[run] = x
	n.s.tracef(n.name, "runs %s epoch %d", run, ep)
	if p.stopping { // claimed while the node drains: handed back at once
		x.cancel(worker.ErrDrain)
		return
	}
	if endedFromOutside(r.Status) { // ended before this execution was registered (checkEnded)
		x.end(fmt.Errorf("%w: %s", errRunEnded, r.Status))
		return
	}
	steps, err := n.store.Steps(run)
	if err != nil {
		n.s.fail("sim", "%s: read steps of %s: %v", n.name, run, err)
		return
	}
	for _, st := range steps {
		if st.Status == checkpoint.StepSucceeded || st.Status == checkpoint.StepSkipped {
			x.done[st.Name] = true
		}
	}
	x.schedule()
}

func endedFromOutside(s checkpoint.RunStatus) bool {
	return s == checkpoint.StatusCancelled || s == checkpoint.StatusDeadLettered
}
