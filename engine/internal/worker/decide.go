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
// states with no I/O, so that transcripts can test them (testdata/*.txt) and the
// deterministic simulation (engine/internal/sim) can drive them. runExec.execute
// carries them out: it runs what ReadySteps returns, and once nothing runs, does what
// DecideEnd says.

// ReadySteps is which steps start now, in the workflow's order: those not done and not
// running whose needs are all done, while the run has room (parallelism counts the
// running ones). A failing run starts nothing.
func ReadySteps(wf *workflow.Workflow, done func(string) bool, running map[string]bool, parallelism int, failing bool) []*workflow.Step {
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

// EndAction is what an epoch does once none of its steps runs any more.
type EndAction int

const (
	EndNothing   EndAction = iota // stolen, completed with the last commit, or ended from outside
	EndHandBack                   // drained: requeue the run for another node, not counted
	EndSteal                      // the lease was lost: stop as lock-stolen-mid-run
	EndFailed                     // write the run's failure
	EndSucceeded                  // write the run's success
	EndPark                       // a step waits for the world: write the park (wait.go)
)

// String names the action (the epoch span's outcome).
func (a EndAction) String() string {
	switch a {
	case EndNothing:
		return "settled"
	case EndHandBack:
		return "handed-back"
	case EndSteal:
		return ReasonStolen
	case EndFailed:
		return "failed"
	case EndSucceeded:
		return "succeeded"
	case EndPark:
		return "parked"
	}
	return "unknown"
}

// EndState is what the epoch knows when its steps have stopped.
type EndState struct {
	Stolen, Completed, Ended bool  // already settled (Completed: with the last commit)
	Cause                    error // why the epoch's context ended (nil if it did not)
	LeaseCause               error // why the lease's context ended (nil if it did not)
	FailedStep               string
	FailedErr                error // the first step error, nil if none failed
	Parked                   bool  // a step asked to park the run
	Done, Total              int   // steps checkpointed, steps in the workflow
}

// EndDecision is DecideEnd's answer: the action, and for EndFailed the step and the
// message, for EndSteal the cause.
type EndDecision struct {
	Action EndAction
	Step   string
	Msg    string
	Cause  error
}

// DecideEnd is what an epoch does once none of its steps runs any more.
func DecideEnd(s EndState) EndDecision {
	switch {
	case s.Stolen, s.Completed, s.Ended:
		return EndDecision{Action: EndNothing}
	case errors.Is(s.Cause, ErrDrain):
		return EndDecision{Action: EndHandBack}
	case s.FailedErr != nil:
		if errors.Is(s.FailedErr, ErrDrain) {
			return EndDecision{Action: EndHandBack}
		}
		if errors.Is(s.LeaseCause, epoch.ErrLeaseLost) {
			return EndDecision{Action: EndSteal, Cause: s.LeaseCause}
		}
		return EndDecision{Action: EndFailed, Step: s.FailedStep, Msg: s.FailedErr.Error()}
	case s.Parked && s.Cause == nil:
		// Every step that could run has run: the run waits (a failure above wins; a lost
		// lease or a drain, which cancel the epoch, are handled as without the wait).
		return EndDecision{Action: EndPark}
	case s.Done < s.Total:
		if errors.Is(s.Cause, epoch.ErrLeaseLost) {
			return EndDecision{Action: EndSteal, Cause: s.Cause}
		}
		return EndDecision{Action: EndFailed, Msg: fmt.Sprint(s.Cause)}
	default:
		return EndDecision{Action: EndSucceeded}
	}
}

// Status is the run status an end decision writes.
func (d EndDecision) Status() checkpoint.RunStatus {
	if d.Action == EndSucceeded {
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
