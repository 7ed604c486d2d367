package leader

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/tasks"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/logstream"
)

// OwnSlots is the worker pool's side of the short path (worker.Pool): a slot reserved
// for a run started on this node, given back if its assign is refused, else run.
type OwnSlots interface {
	ReserveOwn() bool
	ReleaseOwn()
	RunOwn(run string, epoch int64)
}

// StartHere is a run's start on the leader, the short path: the run's first assign
// (with the term) rides in the submit's log message and its task is queued at once,
// instead of the scheduler reacting to the applied submit with a message of its own
// (one synced write and one round trip less per run). It applies only while this node
// leads a term it still trusts and admission has room with no older run waiting
// (admission.go); otherwise it writes nothing and says so (short false), and the
// caller writes the submit alone for the scheduler to assign.
//
// The caller decides whether the run may take it at all: runs of a workflow with a
// concurrency limit, and runs whose ID was given (except one a client derived from its
// nonce), always wait for the scheduler, since with a given ID the submit may be refused
// as a repeat while the assign, judged on its own, would give the existing run an epoch
// past its workflow's limits.
//
// The log judges the assign like any other: if it is refused (the term ended
// meanwhile), the run is pending without an epoch and the next leader assigns it. When
// own has a free slot, the assign also names this node as the epoch's worker (the
// claim rides in the same entry) and the run starts here without a task: one more
// synced write and two round trips less (docs/decisions.md).
func (s *Service) StartHere(ctx context.Context, submit checkpoint.Entry, own OwnSlots) (short bool, err error) {
	term := s.Leading()
	if term == nil || term.Check() != nil || !s.admit() {
		return false, nil
	}
	defer s.cfg.Admission.Admitted()
	return true, s.submitAndAssign(ctx, submit, term, own)
}

// admit reserves room under admission for a run started on the leader.
func (s *Service) admit() bool {
	if s.cfg.Admission == nil {
		return false
	}
	return s.cfg.Admission.Admit(func() int { assigned, _ := s.cfg.State.Held(); return assigned }, s.cfg.State.QueuedRuns)
}

func (s *Service) submitAndAssign(ctx context.Context, submit checkpoint.Entry, term *epoch.Term, own OwnSlots) error {
	assign := checkpoint.Entry{Kind: checkpoint.KindAssign, Run: submit.Run, Term: term.Term(), Owner: s.cfg.Node}
	here := own.ReserveOwn()
	if here {
		assign.Worker = s.cfg.Node
	}
	f := s.cfg.Log.Write(ctx, submit, assign)
	if here {
		// The reserved slot (and its count in the pool's wait group) follows the assign's
		// outcome in the log, not the caller, whose ctx may end first; nor the node's
		// context: a drain goes on applying what is in flight, and an accepted assign
		// must then be handed back (RunOwn does, its lease acquire failing). A write
		// refused before publishing is resolved at once: the slot goes back.
		go func() {
			actx, cancel := context.WithTimeout(context.Background(), 3*logstream.DefaultPublishTimeout)
			err := f.Results(actx)[1]
			cancel()
			if err != nil {
				// Refused, or its outcome unknown (NATS in trouble): if it landed after all,
				// the run is claimed here without a lease and the reconcile reclaims it.
				s.log.Info("the short path's own claim is not run here", "run", submit.Run, "err", err)
				own.ReleaseOwn()
				return
			}
			own.RunOwn(submit.Run, int64(f.Seq()))
		}()
	}
	errs := f.Results(ctx)
	if errs[0] != nil {
		return errs[0]
	}
	if errs[1] != nil {
		s.log.Info("assign with the submit refused; the scheduler assigns the run", "run", submit.Run, "err", errs[1])
		return nil
	}
	// The first epoch, named in the submit span (its owner's own span may never be sent).
	span := trace.SpanFromContext(ctx)
	span.AddEvent("epoch assigned", trace.WithAttributes(attribute.Int64("flow.epoch", int64(f.Seq())),
		attribute.String("flow.epoch.reason", checkpoint.ReasonAssigned), attribute.String("flow.owner", assign.Worker)))
	span.SetAttributes(attribute.Int64("flow.epoch", int64(f.Seq())))
	if !here {
		if err := s.cfg.Tasks.Publish(ctx, tasks.Task{Run: submit.Run, Epoch: int64(f.Seq())}); err != nil {
			s.log.Warn("task not queued; reconcile will retry", "run", submit.Run, "err", err)
		}
	}
	return nil
}
