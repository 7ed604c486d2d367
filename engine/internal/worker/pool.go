package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/tasks"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/internal/base/port"
	"github.com/flowrun/flow/internal/base/supervise"
	"github.com/flowrun/flow/internal/base/testhooks"
	"github.com/flowrun/flow/logstream"
	"github.com/flowrun/flow/workflow"
)

// Pool is this node's workers: it takes tasks while a slot is free, takes the run's
// lease for the task's epoch, claims the epoch in the log and runs the DAG from its
// checkpoints (execute). The task fetch loop is a supervised part (Part); the runs it
// starts belong to the pool, not to the loop: restarting the loop stops no step. Stop
// drains: every running run is handed back.
type Pool struct {
	cfg    Config
	log    *slog.Logger
	hooks  *testhooks.Hooks
	clock  clockwork.Clock
	stats  Stats
	slots  chan struct{} // one per run executed at once, shared with own runs
	wg     sync.WaitGroup
	runCtx context.Context // the runs' context, cancelled by Stop
	cancel context.CancelFunc

	holdingBack atomic.Bool // the fetch loop is waiting out a degraded lease
	// runsEnded counts the runs cancelled or dead-lettered so far (cancel.go).
	runsEnded atomic.Uint64

	mu struct {
		sync.Mutex
		stopping bool
		running  map[string]*runExec // by run ID
		// taking are the epochs a task or the leader's own path is taking or running
		// here: a second delivery of an epoch's task while the first is being taken, or
		// run, waits (nak) instead of running the epoch twice on this node. Its lease would not
		// stop it: Leases.Acquire adopts a lease this node holds for the same epoch (a
		// retried acquire), so both would run, and the second could do a step's side
		// effect after the first parked the run and it moved to a newer epoch (the
		// simulation's seed 932; its control is Hooks.TakeTwice).
		taking map[takeKey]bool
	}
}

// New returns a pool ready to run.
func New(cfg Config) *Pool {
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Pool{cfg: cfg, log: cfg.Logger, hooks: testhooks.OrProduction(cfg.Hooks), clock: cfg.Clock,
		slots: make(chan struct{}, max(cfg.Workers, 1))}
	p.runCtx, p.cancel = context.WithCancel(context.Background())
	p.mu.running = map[string]*runExec{}
	return p
}

// Stats returns the pool's counters.
func (p *Pool) Stats() *Stats { return &p.stats }

// Part is the task fetch loop, for the node's supervisor (the part "tasks"): alive
// when a fetch comes back (with a task or the server's "nothing for you"), and while it
// waits for room of its own (a free slot, a degraded lease renewing); a loop that hears
// nothing is started again on a consumer looked up afresh.
func (p *Pool) Part() supervise.Part {
	return supervise.Part{Name: "tasks", Silence: p.cfg.Silence, Run: p.fetch}
}

func (p *Pool) fetch(ctx context.Context, alive func()) error {
	// Looked up on every start: the consumer, or the whole stream, may be gone (memory
	// storage: an external NATS server that restarted comes back without it).
	cons, err := p.cfg.Tasks.Consumer(ctx)
	if err != nil {
		return err
	}
	alive() // the server answered for the consumer
	idle := p.clock.NewTicker(max(p.cfg.Silence/4, 10*time.Millisecond))
	defer idle.Stop()
	failures := 0
	for {
		select {
		case p.slots <- struct{}{}:
		default:
			// Every slot is busy: nothing to ask NATS for meanwhile, which is not silence.
			select {
			case p.slots <- struct{}{}:
			case <-idle.Chan():
				alive()
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		for p.Degraded() && ctx.Err() == nil {
			// A lease that cannot renew means trouble reaching NATS: take no new work.
			p.holdingBack.Store(true)
			t := p.clock.NewTimer(50 * time.Millisecond)
			select {
			case <-t.Chan():
			case <-ctx.Done():
			}
			t.Stop()
		}
		p.holdingBack.Store(false)
		batch, err := cons.Fetch(ctx, 1, fetchWait)
		got := false
		for _, msg := range batch {
			got = true
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				defer func() { <-p.slots }()
				p.handleTask(p.runCtx, msg)
			}()
		}
		if !got {
			<-p.slots
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil {
			alive() // the server answered
			failures = 0
			continue
		}
		if errors.Is(err, port.ErrNotFound) {
			return err // a new life looks the consumer (and the stream) up again
		}
		// No responders (the stream is gone) fails at once: do not spin on it.
		if failures++; failures == 1 || failures%20 == 0 {
			p.log.Warn("task fetch failed", "err", err, "failures", failures)
		}
		if p.cfg.Backoff.Sleep(ctx, min(failures, 6)) != nil {
			return ctx.Err()
		}
	}
}

// HoldingBack says whether the fetch loop is waiting out a degraded lease.
func (p *Pool) HoldingBack() bool { return p.holdingBack.Load() }

// Degraded says whether a lease this node holds goes unrenewed (its renewals are
// unanswered): such a node takes no new task (the cluster page's lease health).
func (p *Pool) Degraded() bool {
	if p.hooks.IgnoreDegraded.Load() {
		return false
	}
	if p.hooks.ForceDegraded.Load() {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, x := range p.mu.running {
		if x.lease.Degraded() {
			return true
		}
	}
	return false
}

// fetchWait is how long a fetch waits for a task: the server answers an empty fetch
// then ("nothing for you"), which keeps the fetch loop alive for its supervisor.
const fetchWait = 2 * time.Second

// handleTask takes a task: checks it is current, takes the lease, claims the epoch,
// acks the task and runs the epoch.
func (p *Pool) handleTask(ctx context.Context, msg port.Delivery) {
	t, err := tasks.Decode(msg.Data())
	if err != nil {
		p.log.Error("dropping a malformed task", "err", err)
		_ = msg.Term()
		return
	}
	log := p.log.With("run", t.Run, "epoch", t.Epoch)
	// The assign that made this task may not be applied here yet.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = waitFor(wctx, p.cfg.Log, func() bool {
		return JudgeTask(p.read(t.Run), t) != TaskNotYet
	})
	cancel()
	if err != nil {
		// Not applied here yet (or a task of no run): look again a little later, not at
		// once, so that such a task cannot keep a worker busy in a loop.
		_ = msg.Nak(p.retryDelay())
		return
	}
	r := p.read(t.Run)
	if JudgeTask(r, t) == TaskStale {
		_ = msg.Ack() // the run moved on
		return
	}
	if missing := p.missingLabels(r); len(missing) > 0 {
		// Not for this node: put back, not claimed, for a node with the labels (the
		// leader assigned it because one is live; if that one died meanwhile, the task
		// goes round until another reports, or the run is cancelled).
		p.stats.TasksNotHere.Add(1)
		_ = msg.Nak(p.retryDelay())
		return
	}
	if !p.take(t.Run, t.Epoch) {
		// Another delivery of this epoch's task is taken or runs here: look again
		// later, when it is stale (claimed) or its take failed.
		p.stats.TasksDeferred.Add(1)
		_ = msg.Nak(p.retryDelay())
		return
	}
	defer p.untake(t.Run, t.Epoch)
	actx, cancel := context.WithTimeout(ctx, 2*p.cfg.TTL)
	lease, err := p.cfg.Leases.Acquire(actx, t.Run, t.Epoch, p.cfg.Node)
	cancel()
	if err != nil {
		switch {
		case errors.Is(err, epoch.ErrLeaseHeld):
			// Another holder (a zombie of an older epoch) has the lease until it releases
			// it or the lease lapses: try again then. Dropping the task would leave the
			// run to the reconcile's re-queue, which the stream's duplicate window
			// swallows for a minute (TestTaskWithItsLeaseHeldIsRetried).
			p.stats.TasksDeferred.Add(1)
			_ = msg.Nak(p.retryDelay())
		case errors.Is(err, epoch.ErrInvalidRun):
			log.Error("dropping a task whose run cannot hold a lease", "err", err)
			_ = msg.Term() // permanent: a redelivery would fail the same way, forever
			return
		default:
			_ = msg.Nak(p.retryDelay()) // NATS in trouble: not a hot loop meanwhile
		}
		log.Info("task not taken", "err", err)
		return
	}
	// The claim's outcome, not Stop's cancel, decides: a claim accepted while the node
	// stops is run (and handed back by runClaimed), not left without a worker.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*logstream.DefaultPublishTimeout)
	if p.loseClaim() {
		err = fmt.Errorf("%w: a test lost this claim", logstream.ErrAppendUncertain)
	} else {
		err = p.cfg.Log.Write(cctx, checkpoint.Entry{Kind: checkpoint.KindClaim, Run: t.Run, Epoch: t.Epoch, Owner: p.cfg.Node}).Await(cctx)
	}
	cancel()
	if err != nil {
		log.Info("claim not written", "err", err)
		_ = lease.Release(context.Background())
		if errors.Is(err, checkpoint.ErrFenced) || IsVerdict(err) {
			_ = msg.Ack() // the log said no: this task's epoch will not run
		} else {
			// Unknown outcome: if the claim landed, the task comes back stale (the run has
			// an owner) and is acked then; if not, it is claimed again. Acked now, the
			// run would wait for the reconcile's re-queue, which the task stream's
			// duplicate window swallows for a minute (TestClaimOfUnknownOutcomeIsRetried).
			_ = msg.Nak(p.retryDelay())
		}
		return
	}
	_ = msg.Ack()
	p.runClaimed(t.Run, t.Epoch, lease, log, false)
}

// missingLabels are the worker labels r's workflow needs that this node lacks (nil: it
// may run r; also when r's definition cannot be read: the run then fails on its worker,
// where the error is recorded).
func (p *Pool) missingLabels(r *checkpoint.Run) []string {
	if labelsOff != "" || p.hooks.LabelsOff.Load() {
		return nil
	}
	wf, err := p.cfg.Specs.OfRun(r)
	if err != nil {
		return nil
	}
	return workflow.Missing(wf.Labels(), p.cfg.Labels)
}

// labelsOff is the control of worker labels in real processes (-ldflags "-X
// github.com/flowrun/flow/engine/internal/worker.labelsOff=1"; empty in every build
// but the control's): a worker takes every task, whatever labels its run needs, so a
// runs_on step runs on a node without them (TestRunsOnControlLabelsOff).
var labelsOff string

// takeKey is an epoch of a run (Pool.mu.taking).
type takeKey struct {
	run   string
	epoch int64
}

// take marks run's epoch as taken or run here, unless it is already (Pool.mu.taking).
// Another epoch of the run is not refused: its lease decides, as it does on another
// node.
func (p *Pool) take(run string, ep int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := takeKey{run, ep}
	if p.mu.taking[k] && !p.hooks.TakeTwice.Load() {
		return false
	}
	if p.mu.taking == nil {
		p.mu.taking = map[takeKey]bool{}
	}
	p.mu.taking[k] = true
	return true
}

func (p *Pool) untake(run string, ep int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.mu.taking, takeKey{run, ep})
}

// read is the run as this node's state has it (nil if it has none).
func (p *Pool) read(id string) *checkpoint.Run {
	r, err := p.cfg.State.Run(id)
	if err != nil {
		return nil
	}
	return r
}

// retryDelay is how long a task that could not be taken now waits before it is
// delivered again: a quarter of the lease TTL, so a retry comes well within the TTL.
func (p *Pool) retryDelay() time.Duration { return max(p.cfg.TTL/4, 50*time.Millisecond) }

// loseClaim takes one of the claims a test asked to lose (Hooks.LostClaims).
func (p *Pool) loseClaim() bool {
	for {
		n := p.hooks.LostClaims.Load()
		if n <= 0 {
			return false
		}
		if p.hooks.LostClaims.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// runClaimed executes an epoch this node claimed and holds the lease of.
func (p *Pool) runClaimed(run string, ep int64, lease *epoch.Lease, log *slog.Logger, fresh bool) {
	x, err := newRunExec(p, run, ep, lease)
	if err != nil {
		// newRunExec returns no runExec with its error: nothing to run, so the lease goes
		// back at once and the scheduler reclaims the epoch; flowd keeps serving.
		log.Error("cannot run", "err", err)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = lease.Release(ctx)
		return
	}
	x.fresh = fresh
	p.mu.Lock()
	if p.mu.stopping {
		p.mu.Unlock()
		x.handBack()
		x.endSpan(EndHandBack.String(), nil)
		return
	}
	p.mu.running[run] = x
	p.mu.Unlock()
	x.execute()
	p.mu.Lock()
	delete(p.mu.running, run)
	p.mu.Unlock()
}

// ReserveOwn takes a worker slot for a run the leader assigns to its own node, if one
// is free and the node takes new work (not degraded, not stopping). The caller runs it
// (RunOwn) or gives the slot back (ReleaseOwn).
func (p *Pool) ReserveOwn() bool {
	if p.hooks.NoOwnRuns.Load() || p.Degraded() {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.stopping {
		return false
	}
	select {
	case p.slots <- struct{}{}:
		p.wg.Add(1) // under mu: Stop sets stopping under mu before it waits
		return true
	default:
		return false
	}
}

// ReleaseOwn gives back a slot ReserveOwn took, for a run that will not run here.
func (p *Pool) ReleaseOwn() {
	<-p.slots
	p.wg.Done()
}

// RunOwn executes an epoch the log gave this node in its assign (with a slot from
// ReserveOwn): it takes the lease first, as a worker does before it claims, and hands
// the epoch back (a requeue, which does not count toward max_epochs) if it cannot.
func (p *Pool) RunOwn(run string, ep int64) {
	defer p.ReleaseOwn()
	log := p.log.With("run", run, "epoch", ep)
	if !p.take(run, ep) {
		log.Info("an own epoch is taken here already (its task came first)")
		return
	}
	defer p.untake(run, ep)
	actx, cancel := context.WithTimeout(p.runCtx, 2*p.cfg.TTL)
	lease, err := p.cfg.Leases.Acquire(actx, run, ep, p.cfg.Node)
	cancel()
	if err != nil {
		log.Warn("lease of an own run not taken; handing the epoch back", "err", err)
		wctx, cancel := context.WithTimeout(context.WithoutCancel(p.runCtx), 10*time.Second)
		defer cancel()
		if err := p.cfg.Log.Write(wctx, checkpoint.Entry{Kind: checkpoint.KindRequeue, Run: run, Epoch: ep, Owner: p.cfg.Node}).Await(wctx); err != nil {
			log.Warn("hand-back refused; the scheduler reclaims the epoch when its lease is missed", "err", err)
		}
		return
	}
	p.runClaimed(run, ep, lease, log, true)
}

// Drain hands every running run back (a requeue entry, then its lease released) so that
// another node resumes it at once; from now on a run claimed here is handed back too.
// The engine then stops the fetch loop (its supervised part) and calls Wait.
func (p *Pool) Drain() {
	p.mu.Lock()
	p.mu.stopping = true
	running := make([]*runExec, 0, len(p.mu.running))
	for _, x := range p.mu.running {
		running = append(running, x)
	}
	p.mu.Unlock()
	// In the runs' order, not the map's: the same hand-backs in the same order every time.
	slices.SortFunc(running, func(a, b *runExec) int { return strings.Compare(a.run.ID, b.run.ID) })
	for _, x := range running {
		x.drain()
	}
}

// Wait ends the runs' context and waits for every run this pool started, until ctx ends
// (then their leases lapse). Call it after Drain, once the fetch loop has ended: it
// starts no run any more.
func (p *Pool) Wait(ctx context.Context) {
	p.cancel()
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		p.log.Warn("drain did not finish in time; leases will lapse", "err", ctx.Err())
		<-done
	}
}

// Running is the epoch's execution of a run on this node (nil if none): the zombie
// drill's step reaches its own run through it.
func (p *Pool) running(run string) *runExec {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mu.running[run]
}

// waitFor waits until cond holds, re-checking whenever the log applies a message.
func waitFor(ctx context.Context, l Log, cond func() bool) error {
	for {
		changed := l.Changed()
		if cond() {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		case <-l.Failed():
			return l.Err()
		}
	}
}

// StopGrace is the most time a step may take to stop once its context is cancelled
// (steps.Input.StopGrace).
func (p *Pool) StopGrace() time.Duration { return p.stopGrace() }

// RunClaimed executes an epoch this node claimed and holds the lease of, as a task's
// worker does after its claim (the engine's tests drive it directly).
func (p *Pool) RunClaimed(run string, ep int64, lease *epoch.Lease, log *slog.Logger) {
	p.runClaimed(run, ep, lease, log, false)
}

// ProbeEnded reads run id at epoch ep as an execution does before it is registered,
// calls between (where a cancel can be applied that nothing is yet registered to stop),
// then does what an execution does first (checkEnded), and returns the cause its
// context ended with (nil: it goes on). The engine's tests of that gap use it.
func (p *Pool) ProbeEnded(id string, ep int64, lease *epoch.Lease, between func()) (error, error) {
	x, err := newRunExec(p, id, ep, lease)
	if err != nil {
		return nil, err
	}
	defer x.endSpan("probed", nil)
	between()
	x.checkEnded()
	if x.ended.Load() != (x.ctx.Err() != nil) {
		return nil, fmt.Errorf("worker: ended %v but the context's cause is %v", x.ended.Load(), context.Cause(x.ctx))
	}
	return context.Cause(x.ctx), nil
}
