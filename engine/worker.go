package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/internal/ident"
	"github.com/flowrun/flow/logstream"
	"github.com/flowrun/flow/workflow"
)

// runWorkers pulls tasks while a slot is free and no lease of this node is degraded.
// It is the supervised part "tasks": alive when a fetch comes back (with a task or
// with the server's "nothing for you"), and while it waits for room of its own (a free
// slot, a degraded lease renewing); a fetch loop that hears nothing is started again
// on a consumer looked up afresh. The runs it starts belong to the engine (runCtx),
// not to this loop: restarting it stops no step.
func (e *Engine) runWorkers(ctx context.Context, alive func()) error {
	tasks := e.tasks
	if e.tasksOpened.Swap(true) {
		// A restart: the consumer, or the whole stream, may be gone (memory storage:
		// an external NATS server that restarted comes back without it).
		var err error
		if tasks, err = openTasks(ctx, e.js, e.replicas, e.leases.Config().TTL, e.log); err != nil {
			return err
		}
	} else if _, err := tasks.Info(ctx); err != nil {
		return fmt.Errorf("engine: task consumer: %w", err)
	}
	alive()          // the server answered for the consumer
	slots := e.slots // shared with the leader's own runs (submitAndAssign)
	idle := time.NewTicker(max(e.Silence()/4, 10*time.Millisecond))
	defer idle.Stop()
	failures := 0
	for {
		select {
		case slots <- struct{}{}:
		default:
			// Every slot is busy: nothing to ask NATS for meanwhile, which is not silence.
			select {
			case slots <- struct{}{}:
			case <-idle.C:
				alive()
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		for e.degraded() && ctx.Err() == nil {
			// A lease that cannot renew means trouble reaching NATS: take no new work.
			e.holdingBack.Store(true)
			t := time.NewTimer(50 * time.Millisecond)
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
		}
		e.holdingBack.Store(false)
		fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		batch, err := tasks.Fetch(1, jetstream.FetchContext(fctx))
		got := false
		if err == nil {
			for msg := range batch.Messages() {
				got = true
				e.wg.Add(1)
				go func() {
					defer e.wg.Done()
					defer func() { <-slots }()
					e.handleTask(e.runCtx, msg)
				}()
			}
			err = batch.Error()
		}
		cancel()
		if !got {
			<-slots
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil {
			alive() // the server answered
			failures = 0
			continue
		}
		if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
			return err // a new life looks the consumer (and the stream) up again
		}
		// No responders (the stream is gone) fails at once: do not spin on it.
		if failures++; failures == 1 || failures%20 == 0 {
			e.log.Warn("task fetch failed", "err", err, "failures", failures)
		}
		if e.cfg.Lease.Backoff.Sleep(ctx, min(failures, 6)) != nil {
			return ctx.Err()
		}
	}
}

// LeasesDegraded says whether a lease this node holds goes unrenewed (its renewals are
// unanswered): such a node takes no new task (the cluster page's lease health).
func (e *Engine) LeasesDegraded() bool { return e.degraded() }

func (e *Engine) degraded() bool {
	if e.hooks.IgnoreDegraded.Load() {
		return false
	}
	if e.hooks.ForceDegraded.Load() {
		return true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, x := range e.mu.running {
		if x.lease.Degraded() {
			return true
		}
	}
	return false
}

// handleTask takes a task: checks it is current, takes the lease, claims the epoch,
// acks the task and runs the epoch.
func (e *Engine) handleTask(ctx context.Context, msg jetstream.Msg) {
	var t task
	if err := json.Unmarshal(msg.Data(), &t); err != nil || !ident.ValidID(t.Run) || t.Epoch <= 0 {
		// Only the leader writes tasks, for runs of the state (whose IDs apply checked):
		// anything else was forged or corrupted, and redelivering it would loop.
		e.log.Error("dropping a malformed task", "err", err, "task", string(msg.Data()))
		_ = msg.Term()
		return
	}
	log := e.log.With("run", t.Run, "epoch", t.Epoch)
	// The assign that made this task may not be applied here yet.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := waitFor(wctx, e.clog.Applier, func() bool {
		r, err := e.store.Run(t.Run)
		return err == nil && r.Epoch >= t.Epoch
	})
	cancel()
	if err != nil {
		// Not applied here yet (or a task of no run): look again a little later, not at
		// once, so that such a task cannot keep a worker busy in a loop.
		_ = msg.NakWithDelay(e.retryDelay())
		return
	}
	r, err := e.store.Run(t.Run)
	if err != nil || r.Epoch != t.Epoch || r.Status != checkpoint.StatusPending || r.Owner != "" {
		_ = msg.Ack() // a stale task: the run moved on
		return
	}
	actx, cancel := context.WithTimeout(ctx, 2*e.leases.Config().TTL)
	lease, err := e.leases.Acquire(actx, t.Run, t.Epoch, e.cfg.NodeID)
	cancel()
	if err != nil {
		if errors.Is(err, epoch.ErrLeaseHeld) {
			// Another holder (a zombie of an older epoch) has the lease until it releases
			// it or the lease lapses: try again then. Dropping the task would leave the
			// run to the reconcile's re-queue, which the stream's duplicate window
			// swallows for a minute (TestTaskWithItsLeaseHeldIsRetried).
			e.stats.TasksDeferred.Add(1)
			_ = msg.NakWithDelay(e.retryDelay())
		} else if errors.Is(err, epoch.ErrInvalidRun) {
			log.Error("dropping a task whose run cannot hold a lease", "err", err)
			_ = msg.Term() // permanent: a redelivery would fail the same way, forever
			return
		} else {
			_ = msg.NakWithDelay(e.retryDelay()) // NATS in trouble: not a hot loop meanwhile
		}
		log.Info("task not taken", "err", err)
		return
	}
	// The claim's outcome, not Stop's cancel, decides: a claim accepted while the node
	// stops is run (and handed back by runClaimed), not left without a worker.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*logstream.DefaultPublishTimeout)
	if e.loseClaim() {
		err = fmt.Errorf("%w: a test lost this claim", logstream.ErrAppendUncertain)
	} else {
		err = e.clog.Writer.Write(cctx, checkpoint.Entry{Kind: checkpoint.KindClaim, Run: t.Run, Epoch: t.Epoch, Owner: e.cfg.NodeID}).Await(cctx)
	}
	cancel()
	if err != nil {
		log.Info("claim not written", "err", err)
		_ = lease.Release(context.Background())
		if errors.Is(err, checkpoint.ErrFenced) || isVerdict(err) {
			_ = msg.Ack() // the log said no: this task's epoch will not run
		} else {
			// Unknown outcome: if the claim landed, the task comes back stale (the run has
			// an owner) and is acked then; if not, it is claimed again. Acked now, the
			// run would wait for the reconcile's re-queue, which the task stream's
			// duplicate window swallows for a minute (TestClaimOfUnknownOutcomeIsRetried).
			_ = msg.NakWithDelay(e.retryDelay())
		}
		return
	}
	_ = msg.Ack()
	e.runClaimed(t.Run, t.Epoch, lease, log, false)
}

// retryDelay is how long a task that could not be taken now waits before it is
// delivered again: a quarter of the lease TTL, so a retry comes well within the TTL.
func (e *Engine) retryDelay() time.Duration {
	return max(e.leases.Config().TTL/4, 50*time.Millisecond)
}

// loseClaim takes one of the claims a test asked to lose (lostClaims).
func (e *Engine) loseClaim() bool {
	for {
		n := e.hooks.LostClaims.Load()
		if n <= 0 {
			return false
		}
		if e.hooks.LostClaims.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// runClaimed executes an epoch this node claimed and holds the lease of.
func (e *Engine) runClaimed(run string, epoch int64, lease *epoch.Lease, log *slog.Logger, fresh bool) {
	x, err := newRunExec(e, run, epoch, lease)
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
	e.mu.Lock()
	if e.mu.stopping {
		e.mu.Unlock()
		x.handBack()
		return
	}
	e.mu.running[run] = x
	e.mu.Unlock()
	x.execute()
	e.mu.Lock()
	delete(e.mu.running, run)
	e.mu.Unlock()
}

// reserveOwnRun takes a worker slot for a run the leader assigns to its own node, if one
// is free and the node takes new work (not degraded, not stopping). The caller runs it
// (runOwn) or gives the slot back (releaseOwnRun).
func (e *Engine) reserveOwnRun() bool {
	if e.hooks.NoOwnRuns.Load() || e.degraded() {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.stopping || e.slots == nil {
		return false
	}
	select {
	case e.slots <- struct{}{}:
		e.wg.Add(1) // under mu: Stop sets stopping under mu before it waits
		return true
	default:
		return false
	}
}

func (e *Engine) releaseOwnRun() {
	<-e.slots
	e.wg.Done()
}

// runOwn executes an epoch the log gave this node in its assign: it takes the lease
// first, as a worker does before it claims, and hands the epoch back (a requeue, which
// does not count toward max_epochs) if it cannot.
func (e *Engine) runOwn(run string, ep int64) {
	defer e.releaseOwnRun()
	log := e.log.With("run", run, "epoch", ep)
	actx, cancel := context.WithTimeout(e.runCtx, 2*e.leases.Config().TTL)
	lease, err := e.leases.Acquire(actx, run, ep, e.cfg.NodeID)
	cancel()
	if err != nil {
		log.Warn("lease of an own run not taken; handing the epoch back", "err", err)
		wctx, cancel := context.WithTimeout(context.WithoutCancel(e.runCtx), 10*time.Second)
		defer cancel()
		if err := e.clog.Writer.Write(wctx, checkpoint.Entry{Kind: checkpoint.KindRequeue, Run: run, Epoch: ep, Owner: e.cfg.NodeID}).Await(wctx); err != nil {
			log.Warn("hand-back refused; the scheduler reclaims the epoch when its lease is missed", "err", err)
		}
		return
	}
	e.runClaimed(run, ep, lease, log, true)
}

// waitFor waits until cond holds, re-checking whenever the log applies a message.
func waitFor(ctx context.Context, l *logstream.Applier, cond func() bool) error {
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

// runWorkflow is the workflow version a run started with: from the run itself when it
// carries its definition, else from the workflow versions in the log.
func (e *Engine) runWorkflow(r *checkpoint.Run) (*workflow.Workflow, error) {
	if len(r.Spec) > 0 {
		w, err := workflow.Decode(r.Spec)
		if err != nil {
			return nil, fmt.Errorf("engine: run %s: its workflow spec: %w", r.ID, err)
		}
		return w, nil
	}
	w, err := e.Workflow(r.Workflow, r.Version)
	if err != nil {
		return nil, fmt.Errorf("engine: run %s: workflow %s version %d: %w", r.ID, r.Workflow, r.Version, err)
	}
	return w, nil
}
