package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/audit"
	"github.com/flowrun/flow/steps"
	"github.com/flowrun/flow/workflow"
)

// Child runs and the run IDs that are flow's: a workflow step's child started by its
// parent's epoch and taken only if the parent started it; people's run IDs kept out of
// the shapes flow derives; loops of workflows refused at apply.

// checkChildLoop refuses a workflow whose workflow steps lead back to it through the
// latest versions of the workflows they start (a run would start itself without end;
// checkpoint.MaxDepth stops what escapes this check, such as a loop closed by a later
// apply of another workflow).
func (e *Engine) checkChildLoop(w *workflow.Workflow) error {
	type hop struct{ name, path string }
	seen := map[string]bool{}
	queue := []hop{}
	children := func(wf *workflow.Workflow) []string {
		var out []string
		for _, st := range wf.Steps {
			if st.Uses == steps.KindWorkflow {
				out = append(out, steps.ChildWorkflow(st.With))
			}
		}
		return out
	}
	for _, c := range children(w) {
		queue = append(queue, hop{c, w.Name + " -> " + c})
	}
	for len(queue) > 0 {
		h := queue[0]
		queue = queue[1:]
		if h.name == w.Name {
			return fmt.Errorf("workflow steps start a loop: %s (a run would start itself without end)", h.path)
		}
		if seen[h.name] {
			continue
		}
		seen[h.name] = true
		next, err := e.Workflow(h.name, 0)
		if err != nil {
			continue // not applied yet: the depth limit bounds it if it closes a loop later
		}
		for _, c := range children(next) {
			queue = append(queue, hop{c, h.path + " -> " + c})
		}
	}
	return nil
}

// startChild is the workers' StartChild: a run of the latest version of workflow, with
// the ID its parent step derives, started as the parent's starter by the parent's epoch
// (the log refuses the submit of any other epoch).
func (e *Engine) startChild(ctx context.Context, parent *checkpoint.Run, epoch int64, ref checkpoint.ParentRef, id, wf string, inputs map[string]any) error {
	_, err := e.StartRun(audit.WithActor(ctx, parent.StartedBy), wf, inputs, RunOptions{ID: id, Parent: &ref, ParentEpoch: epoch})
	if errors.Is(err, checkpoint.ErrRunExists) {
		// Started before, by an earlier epoch of this step (or a zombie of one): that run
		// names this parent. One that does not was started by someone else under the
		// child's ID, and is never taken for the child.
		if err := e.checkChildOf(id, ref); err != nil {
			return steps.Permanent(err)
		}
		return nil
	}
	if errors.Is(err, ErrBadInput) {
		return steps.Permanent(err)
	}
	return err
}

// checkChildOf says whether the run id is the child that ref (a parent's step and item)
// started: a run of that ID that names another parent, or none, is not adopted (without
// this check a run started by a person under a child's ID gave its outputs to the
// parent, and the real child, with its approvals, never ran).
func (e *Engine) checkChildOf(id string, ref checkpoint.ParentRef) error {
	r, err := e.store.Run(id)
	if err != nil {
		return err
	}
	return checkpoint.ChildOf(r, ref, e.hooks.NoChildBinding.Load() || noChildBinding != "")
}

// ErrReservedID: a run ID a person chose that flow keeps for the runs it derives. Such an
// error is ErrBadInput too (exit 2).
var ErrReservedID = errors.New("engine: reserved run ID")

type reservedIDError struct{ msg string }

func (r reservedIDError) Error() string { return r.msg }
func (r reservedIDError) Is(target error) bool {
	return target == ErrReservedID || target == ErrBadInput
}

// checkChosenID refuses an ID a person chose that flow derives itself: a child's or a
// handler's (<run>.<step>[.<item>]: every ID with a '.'), or a scheduled tick's
// (<workflow>-YYYYMMDDTHHMMSSZ). Taken first, such a run would stand in for the one flow
// starts later (the tick's or the child's is then refused as existing).
func (e *Engine) checkChosenID(id string) error {
	if e.hooks.NoChildBinding.Load() || noChildBinding != "" {
		return nil
	}
	if strings.Contains(id, ".") {
		return reservedIDError{fmt.Sprintf("run ID %q: IDs with '.' are kept for the runs flow derives (a child run <run>.<step>[.<item>], a handler run); choose one without '.'", id)}
	}
	if i := strings.LastIndexByte(id, '-'); i > 0 {
		if _, err := time.Parse("20060102T150405Z", id[i+1:]); err == nil {
			return reservedIDError{fmt.Sprintf("run ID %q: IDs ending in -YYYYMMDDTHHMMSSZ are kept for the runs of scheduled ticks (<workflow>-<tick>); choose another", id)}
		}
	}
	return nil
}

// noChildBinding is the child binding's control for a process (-ldflags "-X
// github.com/flowrun/flow/engine.noChildBinding=1"; empty in every release build): people
// may choose children's IDs and a parent adopts what it finds under its child's ID
// (TestSquattedChildIsRefused's control).
var noChildBinding string
