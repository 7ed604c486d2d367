package engine

import (
	"context"
	"errors"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/epoch"
)

// scheduler is the leader's work for one term: assign pending runs, reclaim runs whose
// lease lapsed, and reconcile (a running run without a live lease is reclaimed). Every
// entry it writes carries the term; it checks its trust window before each.
type scheduler struct {
	e       *Engine
	term    *epoch.Term
	watcher *epoch.LeaseWatcher
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
	reconcile := time.NewTicker(s.e.cfg.ReconcileInterval)
	defer reconcile.Stop()
	for {
		changed := s.e.clog.Changed()
		s.assignPending(ctx)
		select {
		case <-ctx.Done():
			return
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
func (s *scheduler) write(ctx context.Context, e checkpoint.Entry) (uint64, error) {
	if err := s.term.Check(); err != nil {
		return 0, err
	}
	e.Term = s.term.Term()
	e.Owner = s.e.cfg.NodeID
	return s.e.clog.Write(ctx, e)
}

// needsAssign: pending and without a usable epoch.
func needsAssign(r *checkpoint.Run) bool {
	return r.Status == checkpoint.StatusPending && (r.Epoch == 0 || r.HandedBack || r.RetryRequested)
}

func (s *scheduler) assignPending(ctx context.Context) {
	after := ""
	active := map[string]int{} // runs per workflow holding an epoch, for concurrency limits
	counted := false
	for ctx.Err() == nil {
		runs, next, err := s.e.store.ListRuns(checkpoint.ListOptions{Status: checkpoint.StatusPending, After: after, Limit: 256})
		if err != nil {
			s.e.log.Error("list pending runs", "err", err)
			return
		}
		for i := range runs {
			r := &runs[i]
			if !needsAssign(r) {
				continue
			}
			if limit := s.concurrency(r); limit > 0 {
				if !counted {
					active = s.activeByWorkflow()
					counted = true
				}
				if active[r.Workflow] >= limit {
					continue
				}
				active[r.Workflow]++
			}
			s.assign(ctx, r.ID, r.Epoch, "")
		}
		if next == "" {
			return
		}
		after = next
	}
}

func (s *scheduler) concurrency(r *checkpoint.Run) int {
	spec, err := decodeSpec(r.Spec)
	if err != nil {
		return 0
	}
	return spec.Concurrency
}

func (s *scheduler) activeByWorkflow() map[string]int {
	n := map[string]int{}
	for _, st := range []checkpoint.RunStatus{checkpoint.StatusRunning, checkpoint.StatusPending} {
		after := ""
		for {
			runs, next, err := s.e.store.ListRuns(checkpoint.ListOptions{Status: st, After: after, Limit: 1000})
			if err != nil {
				return n
			}
			for _, r := range runs {
				if r.Status == checkpoint.StatusRunning || !needsAssign(&r) {
					n[r.Workflow]++
				}
			}
			if next == "" {
				break
			}
			after = next
		}
	}
	return n
}

// assign gives a run a new epoch (replacing expect) and queues its task.
func (s *scheduler) assign(ctx context.Context, run string, expect int64, reason string) {
	seq, err := s.write(ctx, checkpoint.Entry{Kind: checkpoint.KindAssign, Run: run, Epoch: expect, Reason: reason})
	switch {
	case err == nil:
	case errors.Is(err, checkpoint.ErrDeadLettered):
		s.e.log.Warn("run dead-lettered: max_epochs exceeded", "run", run, "term", s.term.Term())
		return
	case errors.Is(err, checkpoint.ErrConflict):
		return // someone moved it on meanwhile
	default:
		s.e.log.Warn("assign failed", "run", run, "term", s.term.Term(), "err", err)
		return
	}
	if err := publishTask(ctx, s.e.js, task{Run: run, Epoch: int64(seq)}); err != nil {
		s.e.log.Warn("task not queued; reconcile will retry", "run", run, "err", err)
	}
}

// reclaim gives a new epoch to a running run whose lease for epoch ended.
func (s *scheduler) reclaim(ctx context.Context, run string, ep int64, reason string) {
	r, err := s.e.store.Run(run)
	if err != nil || r.Status != checkpoint.StatusRunning || r.Epoch != ep {
		return // finished, handed back, or already moved on
	}
	s.e.log.Info("reclaiming run", "run", run, "epoch", ep, "owner", r.Owner, "reason", reason, "term", s.term.Term())
	s.assign(ctx, run, ep, reason)
}

// reconcile: every run the state calls running must have a live lease; a run assigned
// but not claimed within a TTL gets its task queued again.
func (s *scheduler) reconcile(ctx context.Context) {
	after := ""
	for ctx.Err() == nil {
		runs, next, err := s.e.store.ListRuns(checkpoint.ListOptions{Status: checkpoint.StatusRunning, After: after, Limit: 256})
		if err != nil {
			return
		}
		for _, r := range runs {
			if l, ok := s.watcher.Live(r.ID); !ok || l.Epoch != r.Epoch {
				s.reclaim(ctx, r.ID, r.Epoch, checkpoint.ReasonReconciled)
			}
		}
		if next == "" {
			break
		}
		after = next
	}
	ttl := s.e.leases.Config().TTL
	after = ""
	for ctx.Err() == nil {
		runs, next, err := s.e.store.ListRuns(checkpoint.ListOptions{Status: checkpoint.StatusPending, After: after, Limit: 256})
		if err != nil {
			return
		}
		for _, r := range runs {
			if !needsAssign(&r) && r.Epoch > 0 && time.Since(r.UpdatedAt) > ttl {
				// Assigned, never claimed: the task may be lost. Re-queueing the same
				// epoch is safe: a task is only ever claimed once per epoch.
				_ = publishTask(ctx, s.e.js, task{Run: r.ID, Epoch: r.Epoch})
			}
		}
		if next == "" {
			return
		}
		after = next
	}
}
