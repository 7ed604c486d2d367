package worker

import (
	"errors"
	"fmt"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/tasks"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/workflow"
)

// The decisions of a run's execution, as functions of the workflow and the steps'
// states with no I/O, so that tables can test them (decide_test.go). runExec.execute
// carries them out: it runs what readySteps returns, and once nothing runs, does what
// decideEnd says.

// readySteps is which steps start now, in the workflow's order: those not done and not
// running whose needs are all done, while the run has room (parallelism counts the
// running ones). A failing run starts nothing.
func readySteps(wf *workflow.Workflow, done func(string) bool, running map[string]bool, parallelism int, failing bool) []*workflow.Step {
	if failing {
		return nil
	}
	var ready []*workflow.Step
	for _, st := range wf.Steps {
		if len(running)+len(ready) >= parallelism {
			break
		}
		if done(st.Name) || running[st.Name] || !needsDone(st, done) {
			continue
		}
		ready = append(ready, st)
	}
	return ready
}

func needsDone(st *workflow.Step, done func(string) bool) bool {
	for _, n := range st.Needs {
		if !done(n) {
			return false
		}
	}
	return true
}

// endAction is what an epoch does once none of its steps runs any more.
type endAction int

const (
	endNothing   endAction = iota // stolen, completed with the last commit, or ended from outside
	endHandBack                   // drained: requeue the run for another node, not counted
	endSteal                      // the lease was lost: stop as lock-stolen-mid-run
	endFailed                     // write the run's failure
	endSucceeded                  // write the run's success
)

// endState is what the epoch knows when its steps have stopped.
type endState struct {
	stolen, completed, ended bool  // already settled (completed: with the last commit)
	cause                    error // why the epoch's context ended (nil if it did not)
	leaseCause               error // why the lease's context ended (nil if it did not)
	failedStep               string
	failedErr                error // the first step error, nil if none failed
	done, total              int   // steps checkpointed, steps in the workflow
}

// endDecision is decideEnd's answer: the action, and for endFailed the step and the
// message, for endSteal the cause.
type endDecision struct {
	action endAction
	step   string
	msg    string
	cause  error
}

func decideEnd(s endState) endDecision {
	switch {
	case s.stolen, s.completed, s.ended:
		return endDecision{action: endNothing}
	case errors.Is(s.cause, errDrain):
		return endDecision{action: endHandBack}
	case s.failedErr != nil:
		if errors.Is(s.failedErr, errDrain) {
			return endDecision{action: endHandBack}
		}
		if errors.Is(s.leaseCause, epoch.ErrLeaseLost) {
			return endDecision{action: endSteal, cause: s.leaseCause}
		}
		return endDecision{action: endFailed, step: s.failedStep, msg: s.failedErr.Error()}
	case s.done < s.total:
		if errors.Is(s.cause, epoch.ErrLeaseLost) {
			return endDecision{action: endSteal, cause: s.cause}
		}
		return endDecision{action: endFailed, msg: fmt.Sprint(s.cause)}
	default:
		return endDecision{action: endSucceeded}
	}
}

// status is the run status an end decision writes.
func (d endDecision) status() checkpoint.RunStatus {
	if d.action == endSucceeded {
		return checkpoint.StatusSucceeded
	}
	return checkpoint.StatusFailed
}

// TaskVerdict is what a worker does with a task.
type TaskVerdict int

const (
	// TaskNotYet: this node has not applied the assign that made the task (or has no
	// such run): look again a little later.
	TaskNotYet TaskVerdict = iota
	// TaskStale: the run moved on (a newer epoch, claimed, ended): ack and drop it.
	TaskStale
	// TaskTake: take the lease and claim the epoch.
	TaskTake
)

// JudgeTask judges a task against the run as this node's state has it (nil: no run).
func JudgeTask(r *checkpoint.Run, t tasks.Task) TaskVerdict {
	switch {
	case r == nil || r.Epoch < t.Epoch:
		return TaskNotYet
	case r.Epoch != t.Epoch || r.Status != checkpoint.StatusPending || r.Owner != "":
		return TaskStale
	}
	return TaskTake
}
