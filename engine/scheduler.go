package engine

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/dlq"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/logstream"
)

// scheduler is the leader's work for one term: assign pending runs, reclaim runs whose
// lease lapsed, and reconcile (a running run without a live lease is reclaimed). Every
// entry it writes carries the term; it checks its trust window before each.
type scheduler struct {
	e       *Engine
	term    *epoch.Term
	watcher *epoch.LeaseWatcher
	delayed map[string]time.Time // runs waiting out the lock delay, by when they may be reclaimed
	// suspects are running runs a reconcile pass found without a live lease although the
	// log changed them less than a TTL ago, with when it first did (monotonic). They are
	// reclaimed once that has lasted a TTL: the lease watcher can lag behind the log (a
	// run claimed a moment ago, after a NATS server was lost and the streams recovered),
	// and a reclaim costs the run a counted epoch change. Runs quiet for a TTL, and lapses
	// the watcher sees, are reclaimed at once. (A wrong wall clock on a writer can only
	// make a reclaim come a TTL later, or as early as before this rule.)
	suspects map[string]suspect
}

type suspect struct {
	epoch int64
	since time.Time
}

func newScheduler(e *Engine, term *epoch.Term) *scheduler { return &scheduler{e: e, term: term} }

func (s *scheduler) run(parent context.Context) {
	ctx, cancel := context.WithCancel(s.term.Context())
	defer cancel()
	go func() {
		select {
		case <-parent.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	w, err := s.e.leases.Watch(ctx)
	if err != nil {
		s.e.log.Error("lease watcher", "err", err)
		return
	}
	defer w.Stop()
	s.watcher = w
	select {
	case <-w.Ready():
	case <-ctx.Done():
		return
	}
	s.reconcile(ctx)
	cronDone, snapDone, retireDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() { defer close(cronDone); s.runCron(ctx) }()
	go func() { defer close(snapDone); s.runSnapshots(ctx) }()
	go func() { defer close(retireDone); s.runRetention(ctx) }()
	defer func() { cancel(); <-cronDone; <-snapDone; <-retireDone }()
	reconcile := time.NewTicker(s.e.cfg.ReconcileInterval)
	defer reconcile.Stop()
	for {
		if high := s.e.store.HighestTerm(); high > s.term.Term() {
			// Another term above ours was applied: every entry of ours is stale now.
			// Stop leading (and waking on our own rejections); the election decides.
			s.e.log.Error("a higher term than ours was applied: stepping down", "term", s.term.Term(), "highest_applied", high)
			return
		}
		changed := s.e.clog.Applier.Changed()
		seen := s.e.store.Applied()
		s.assignPending(ctx)
		s.e.hooks.ScheduledUpTo.Store(seen)
		select {
		case <-ctx.Done():
			return
		case <-s.e.failedApplier():
			return // the state no longer follows the log: step down (runLeadership sits out)
		case ev := <-w.Events():
			if ev.Kind == epoch.LeaseLapsed {
				s.reclaim(ctx, ev.Lease.Run, ev.Lease.Epoch, checkpoint.ReasonLeaseExpired)
			}
		case <-reconcile.C:
			s.reconcile(ctx)
		case <-changed:
		}
	}
}

// write appends a scheduler entry with the term, after the local trust check.
func (s *scheduler) write(ctx context.Context, entry checkpoint.Entry) (uint64, error) {
	if err := s.term.Check(); err != nil {
		return 0, err
	}
	entry.Term = s.term.Term()
	entry.Owner = s.e.cfg.NodeID
	f := s.e.clog.Writer.Write(ctx, entry)
	err := f.Await(ctx)
	return f.Seq(), err
}

// assignPending assigns the oldest pending runs, as many as admission allows
// (admission.go): the rest wait in the state without an epoch.
func (s *scheduler) assignPending(ctx context.Context) {
	room := s.e.admissionRoom()
	if room <= 0 {
		s.e.backlogged.Store(s.e.store.QueuedRuns() > 0)
		return
	}
	// Runs left when the room ran out wait for it: StartRun's short path may not pass
	// them (admit). Runs skipped for their concurrency limit do not count.
	defer func() { s.e.backlogged.Store(room <= 0 && s.e.store.QueuedRuns() > 0) }()
	var active map[string]int // runs per workflow holding an epoch, for concurrency limits
	var batch []*checkpoint.Run
	err := s.e.store.EachQueued(func(r *checkpoint.Run) checkpoint.QueueVerdict {
		if limit := s.concurrency(r); limit > 0 {
			if active == nil {
				active = s.e.store.HeldByWorkflow()
			}
			if active[r.Workflow] >= limit {
				// Its later runs cannot go either: pass over them without reading them,
				// so that a million runs held back by a limit cost a pass one read.
				return checkpoint.QueueSkipWorkflow
			}
			active[r.Workflow]++
		}
		batch = append(batch, r)
		if len(batch) == min(room, logstream.DefaultMaxBatchEntries) { // one log message (assignAll)
			room -= len(batch)
			s.assignAll(ctx, batch)
			batch = nil
		}
		if room <= 0 || ctx.Err() != nil {
			return checkpoint.QueueStop
		}
		return checkpoint.QueueNext
	})
	if err != nil {
		s.e.log.Error("list pending runs", "err", err)
	}
	s.assignAll(ctx, batch)
}

// assignAll assigns runs together: the assigns share one log message (each judged on its
// own; at most logstream.DefaultMaxBatchEntries) and the tasks are published without
// waiting for each ack in turn.
func (s *scheduler) assignAll(ctx context.Context, runs []*checkpoint.Run) {
	if len(runs) == 0 || s.term.Check() != nil {
		return
	}
	// Counted as admitted until applied: the state counts them from then on.
	s.e.admitting.Add(int64(len(runs)))
	defer s.e.admitting.Add(-int64(len(runs)))
	assigns := make([]checkpoint.Entry, len(runs))
	for i, r := range runs {
		assigns[i] = checkpoint.Entry{Kind: checkpoint.KindAssign, Run: r.ID, Epoch: r.Epoch, Term: s.term.Term(), Owner: s.e.cfg.NodeID}
	}
	written := s.e.clog.Writer.Write(ctx, assigns...)
	var acks []jetstream.PubAckFuture
	for i, err := range written.Results(ctx) {
		if err != nil {
			s.assignFailed(runs[i].ID, err)
			continue
		}
		if f, err := publishTaskAsync(s.e.js, task{Run: runs[i].ID, Epoch: int64(written.Seq())}); err == nil {
			acks = append(acks, f)
		} else {
			s.e.log.Warn("task not queued; reconcile will retry", "run", runs[i].ID, "err", err)
		}
	}
	for _, f := range acks {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			s.e.log.Warn("task not queued; reconcile will retry", "err", err)
		case <-ctx.Done():
			return
		}
	}
}

func (s *scheduler) assignFailed(run string, err error) {
	switch {
	case errors.Is(err, checkpoint.ErrDeadLettered):
		s.e.log.Warn("run dead-lettered: max_epochs exceeded", "run", run, "term", s.term.Term())
		s.announceDeadLetter(run)
	case errors.Is(err, checkpoint.ErrConflict):
		// someone moved it on meanwhile
	default:
		s.e.log.Warn("assign failed", "run", run, "term", s.term.Term(), "err", err)
	}
}

func (s *scheduler) concurrency(r *checkpoint.Run) int {
	spec, err := s.e.runWorkflow(r)
	if err != nil {
		return 0
	}
	return spec.Concurrency
}

// assign gives a run a new epoch (replacing expect) and queues its task.
func (s *scheduler) assign(ctx context.Context, run string, expect int64, reason string) {
	seq, err := s.write(ctx, checkpoint.Entry{Kind: checkpoint.KindAssign, Run: run, Epoch: expect, Reason: reason})
	if err != nil {
		s.assignFailed(run, err)
		return
	}
	if err := publishTask(ctx, s.e.js, task{Run: run, Epoch: int64(seq)}); err != nil {
		s.e.log.Warn("task not queued; reconcile will retry", "run", run, "err", err)
	}
}

// announceDeadLetter publishes a dead-lettered run on the DLQ stream (idempotent).
func (s *scheduler) announceDeadLetter(run string) {
	r, err := s.e.store.Run(run)
	if err != nil || r.Status != checkpoint.StatusDeadLettered {
		return
	}
	owner := ""
	for i := len(r.Epochs) - 1; i >= 0 && owner == ""; i-- {
		owner = r.Epochs[i].Owner
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := dlq.Publish(ctx, s.e.js, dlq.Message{Run: r.ID, Workflow: r.Workflow, Epoch: r.Epoch, EpochChanges: r.EpochChanges,
		MaxEpochs: r.MaxEpochs, Reason: r.DeadLetter, LastOwner: owner, At: r.UpdatedAt.UTC().Format(time.RFC3339)}); err != nil {
		s.e.log.Warn("DLQ notice not published; the next reconcile retries", "run", run, "err", err)
	}
}

// reclaim gives a new epoch to a running run whose lease for epoch ended, after the
// configured lock delay (Chubby's remedy for downstream systems that cannot check
// fencing tokens: the old holder's in-flight writes land before anyone starts again).
func (s *scheduler) reclaim(ctx context.Context, run string, ep int64, reason string) {
	r, err := s.e.store.Run(run)
	if err != nil || r.Status != checkpoint.StatusRunning || r.Epoch != ep {
		return // finished, handed back, or already moved on
	}
	if d := s.e.cfg.LockDelay; d > 0 {
		if s.delayed == nil {
			s.delayed = map[string]time.Time{}
		}
		due, waiting := s.delayed[run]
		if !waiting {
			s.delayed[run] = time.Now().Add(d)
			s.e.log.Info("lease ended; reclaim after the lock delay", "run", run, "epoch", ep, "delay", d)
			return
		}
		if time.Now().Before(due) {
			return
		}
		delete(s.delayed, run)
	}
	s.e.log.Info("reclaiming run", "run", run, "epoch", ep, "owner", r.Owner, "reason", reason, "term", s.term.Term())
	s.assign(ctx, run, ep, reason)
}

// reconcile: every run the state calls running must have a live lease; a run assigned
// but not claimed within a TTL gets its task queued again; every dead-lettered run has
// its DLQ notice (deduplicated by the stream).
func (s *scheduler) reconcile(ctx context.Context) {
	_ = s.e.store.EachRun(checkpoint.ListOptions{Status: checkpoint.StatusDeadLettered}, func(r *checkpoint.Run) bool {
		s.announceDeadLetter(r.ID)
		return ctx.Err() == nil
	})
	ttl := s.e.leases.Config().TTL
	if s.suspects == nil {
		s.suspects = map[string]suspect{}
	}
	seen := map[string]bool{}
	_ = s.e.store.EachRun(checkpoint.ListOptions{Status: checkpoint.StatusRunning}, func(r *checkpoint.Run) bool {
		seen[r.ID] = true
		if l, ok := s.watcher.Live(r.ID); ok && l.Epoch == r.Epoch {
			delete(s.suspects, r.ID)
			return ctx.Err() == nil
		}
		sus, known := s.suspects[r.ID]
		known = known && sus.epoch == r.Epoch
		switch {
		case time.Since(r.UpdatedAt) >= ttl, known && time.Since(sus.since) >= ttl:
			// Quiet for a TTL by the log's clock, or lease-less for a TTL by ours.
			delete(s.suspects, r.ID)
			s.reclaim(ctx, r.ID, r.Epoch, checkpoint.ReasonReconciled)
		case !known:
			s.suspects[r.ID] = suspect{epoch: r.Epoch, since: time.Now()}
		}
		return ctx.Err() == nil
	})
	for id := range s.suspects {
		if !seen[id] {
			delete(s.suspects, id) // finished, or moved on
		}
	}
	// Only the assigned runs, not every pending one: with a backlog of a million runs
	// waiting for admission, a scan of them all every pass would starve running runs.
	for _, id := range s.e.store.AssignedRuns() {
		if ctx.Err() != nil {
			return
		}
		r, err := s.e.store.Run(id)
		if err != nil || r.Status != checkpoint.StatusPending {
			continue
		}
		if !r.NeedsAssign() && r.Epoch > 0 && time.Since(r.UpdatedAt) > ttl {
			// Assigned, never claimed: the task may be lost. Re-queueing the same
			// epoch is safe: a task is only ever claimed once per epoch. The task
			// stream's duplicate window makes a re-queue within a minute of the last
			// one a no-op, so this is for lost tasks only: a worker that meets a held
			// lease puts its task back (handleTask).
			_ = publishTask(ctx, s.e.js, task{Run: r.ID, Epoch: r.Epoch})
		}
	}
}
