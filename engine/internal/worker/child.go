package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/steps"
	"github.com/flowrun/flow/workflow"
)

// Child workflows (checkpoint/wait.go): a `uses: workflow` step starts one child run
// (or one per foreach item, at most parallelism at once) with an ID derived from the
// run, the step and the item (checkpoint.ChildID), and parks until they end. A child's
// start is a submit that names its parent: written again by a later epoch (the owner
// crashed after it), it is refused as existing, so there is one child. A succeeded
// child's outputs are the step's (or the item's) output; a failed one is retried (an
// operator's retry of it, from its checkpoints) while the step's retry policy allows,
// then fails the step.

// StartChild starts a child run: id, of workflow with inputs, for ref; an existing run
// of that ID is no error (it was started before).
// The start is the parent's epoch's write (epoch): the log refuses it from any other.
type StartChild func(ctx context.Context, parent *checkpoint.Run, epoch int64, ref checkpoint.ParentRef, id, workflow string, inputs map[string]any) error

// Link-time test switches of real-process tests (-ldflags "-X
// github.com/flowrun/flow/engine/internal/worker.NAME=1"; empty in every release build):
// killAfterChildStart makes the process SIGKILL itself right after a child's start is
// applied, before its parent parks; randomChildIDs is RandomChildIDs' control for a
// process (TestChildStartedOnceAcrossAnOwnerKill).
// noChildBinding is the child binding's control (engine's noChildBinding, for the
// worker): a parent takes whatever run it finds under its child's ID.
var killAfterChildStart, randomChildIDs, noChildBinding string

// childID is the child's ID (random with the RandomChildIDs control: a new child per
// start).
func (x *runExec) childID(step string, item int) string {
	id := checkpoint.ChildID(x.run.ID, step, item)
	if x.p.hooks.RandomChildIDs.Load() || randomChildIDs != "" {
		id = checkpoint.ChildID(x.run.ID, fmt.Sprintf("%s-%d", step, x.p.clock.Now().UnixNano()), item)
	}
	return id
}

func (x *runExec) runChild(st *workflow.Step, scope map[string]any) error {
	if x.p.cfg.StartChild == nil {
		return x.failStep(st, checkpoint.ItemWhole, 1, steps.Permanentf("this node cannot start child runs"))
	}
	r, err := x.p.cfg.State.Run(x.run.ID)
	if err != nil {
		return err
	}
	items := []any{nil}
	if st.Foreach != "" {
		v, err := render(st.Foreach, scope)
		if err != nil {
			return x.failStep(st, checkpoint.ItemWhole, 1, fmt.Errorf("foreach: %w", err))
		}
		list, ok := v.([]any)
		if !ok && v != nil {
			return x.failStep(st, checkpoint.ItemWhole, 1, fmt.Errorf("foreach: %s is %s, not a list", st.Foreach, jsonKind(v)))
		}
		items = list
		x.note(checkpoint.Entry{Kind: checkpoint.KindStart, Step: st.Name, Item: checkpoint.ItemWhole, Items: len(items)})
	}
	have := map[int]bool{}
	if st.Foreach != "" {
		done, err := x.p.cfg.State.Items(x.run.ID, st.Name)
		if err != nil {
			return err
		}
		for _, it := range done {
			have[it.Index] = true
		}
	}
	room := 1
	if st.Foreach != "" {
		room = max(st.Parallelism, 1)
		if err := x.treeRoom(st, items, have); err != nil {
			return x.failStep(st, checkpoint.ItemWhole, 1, steps.Permanent(err))
		}
	}
	var waiting []string
	for i, item := range items {
		index := i
		if st.Foreach == "" {
			index = checkpoint.ItemWhole
		}
		if have[index] {
			continue
		}
		id := x.childID(st.Name, index)
		child, err := x.p.cfg.State.Run(id)
		if err != nil && !errors.Is(err, checkpoint.ErrNotFound) {
			return err
		}
		if child != nil {
			// Only the run this step started is its child: never one that someone else
			// started under the child's ID.
			if err := checkpoint.ChildOf(child, checkpoint.ParentRef{Run: x.run.ID, Step: st.Name, Item: index}, x.p.hooks.NoChildBinding.Load() || noChildBinding != ""); err != nil {
				return x.failStep(st, index, 1, steps.Permanent(err))
			}
		}
		switch {
		case child == nil:
			if len(waiting) >= room {
				continue // started when a running one ends
			}
			itemScope := scope
			if st.Foreach != "" {
				itemScope = make(map[string]any, len(scope)+1)
				for k, v := range scope {
					itemScope[k] = v
				}
				itemScope["item"] = item
			}
			with, err := renderWith(st.With, itemScope)
			if err != nil {
				return x.failStep(st, index, 1, steps.Permanent(err))
			}
			cw, err := steps.ParseChildWith(with)
			if err != nil {
				return x.failStep(st, index, 1, err)
			}
			ctx, cancel := context.WithTimeout(context.WithoutCancel(x.ctx), 30*time.Second)
			err = x.p.cfg.StartChild(ctx, r, x.epoch, checkpoint.ParentRef{Run: x.run.ID, Step: st.Name, Item: index}, id, cw.Workflow, cw.Inputs)
			cancel()
			if err != nil {
				if IsVerdict(err) || errors.Is(err, steps.ErrPermanent) {
					return x.failStep(st, index, 1, steps.Permanentf("start child %s: %v", id, err))
				}
				return x.steal(err) // the log's outcome is unknown: the next epoch starts it
			}
			if killAfterChildStart != "" {
				x.log.Warn("test build: this process kills itself after a child's start (killAfterChildStart)", "child", id)
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
			waiting = append(waiting, id)
		case child.Status == checkpoint.StatusSucceeded:
			out := child.Outputs
			if len(out) == 0 {
				out = json.RawMessage(`{}`)
			}
			if st.Foreach == "" {
				if err := x.commit(checkpoint.Entry{Kind: checkpoint.KindCommit, Step: st.Name, Item: checkpoint.ItemWhole, Output: out, Attempt: 1}); err != nil {
					return err
				}
				x.finish(st.Name, decodeOutput(out))
				return nil
			}
			if err := x.write(checkpoint.Entry{Kind: checkpoint.KindCommit, Step: st.Name, Item: index, Output: out}); err != nil {
				return err
			}
		case child.Status.Terminal():
			retried := 0
			for _, ep := range child.Epochs {
				if ep.Reason == checkpoint.ReasonRetried {
					retried++
				}
			}
			if retried+1 >= st.Retry.MaxAttempts {
				msg := child.Error
				if child.Status == checkpoint.StatusDeadLettered {
					msg = child.DeadLetter
				}
				return x.failStep(st, index, retried+1, steps.Permanentf("child run %s %s: %s", id, child.Status, msg))
			}
			ctx, cancel := context.WithTimeout(context.WithoutCancel(x.ctx), 30*time.Second)
			err := x.p.cfg.Log.Write(ctx, checkpoint.Entry{Kind: checkpoint.KindRetry, Run: id, Owner: x.p.cfg.Node, Reason: "its parent's retry policy"}).Await(ctx)
			cancel()
			if err != nil && !errors.Is(err, checkpoint.ErrConflict) {
				return x.steal(err)
			}
			x.log.Info("child run retried", "child", id, "attempt", retried+2)
			waiting = append(waiting, id)
		default:
			waiting = append(waiting, id)
		}
	}
	if len(waiting) > 0 {
		return &parkRequest{step: st.Name, wait: checkpoint.Wait{Kind: checkpoint.WaitChild, Children: waiting}}
	}
	if st.Foreach == "" {
		return nil // unreachable: a whole step's child either runs, ended or was started
	}
	return x.commitForeach(st)
}

// treeRoom refuses, before any is started, a foreach whose children would not fit in the
// run's tree (Config.MaxRunTree): the log would refuse the child past the bound anyway,
// after the ones before it ran (a foreach over 10,001 children once made 3,100 runs).
func (x *runExec) treeRoom(st *workflow.Step, items []any, have map[int]bool) error {
	bound := x.p.cfg.MaxRunTree
	if bound <= 0 || len(items) < 2 {
		return nil
	}
	root := x.run
	for depth := 0; root.Parent != nil && depth <= checkpoint.MaxDepth; depth++ {
		up, err := x.p.cfg.State.Run(root.Parent.Run)
		if err != nil {
			break // retired: the log counts from the run it finds
		}
		root = up
	}
	free := bound - 1 - root.TreeSize
	if len(items)-len(have) <= free {
		return nil
	}
	missing := 0
	for i := range items {
		if have[i] {
			continue
		}
		if _, err := x.p.cfg.State.Run(x.childID(st.Name, i)); errors.Is(err, checkpoint.ErrNotFound) {
			missing++
		}
	}
	if missing <= free {
		return nil
	}
	return fmt.Errorf("foreach over %d items would start %d child runs; run %s's tree (the run and all its descendants) has room for %d more of its %d (flowd --max-run-tree)",
		len(items), missing, root.ID, max(free, 0), bound)
}
