package worker

import (
	"errors"
	"fmt"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/tasks"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/steps"
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

// AttemptAction is what a step's attempt loop does once an attempt has ended.
type AttemptAction int

const (
	AttemptDone       AttemptAction = iota // it succeeded: checkpoint its output
	AttemptEpochEnded                      // the epoch ended meanwhile: return its cause, record nothing
	AttemptSteal                           // the lease is gone: stop as lock-stolen-mid-run, record nothing
	AttemptAgain                           // run it again, not counted against the retry policy
	AttemptRetry                           // a counted retry, after the policy's backoff
	AttemptFail                            // the step's final failure: record it
)

// MaxTrustRestarts bounds the attempts run again because the step's init stopped the
// step at a trust deadline the lease outlived. Each is a renewal that reached the worker
// after the init's copy of the deadline had passed (a node too loaded to forward it in
// time); past the bound the node gives the epoch up, as if the lease had lapsed: its
// release lets another node (or this one, later) take the run in a new epoch, counted
// against max_epochs, so a node that cannot keep a step alive cannot loop on it.
const MaxTrustRestarts = 3

// AttemptState is what the attempt loop knows once an attempt has ended.
type AttemptState struct {
	Err        error // the attempt's error; nil: it succeeded
	Attempt    int   // this attempt's number, from 1 (an uncounted restart keeps it)
	Max        int   // the retry policy's maximum attempts
	EpochEnded bool  // the epoch's context ended (a lost lease, a drain, a sibling's failure)
	// LeaseErr is the lease's local check after the attempt (Lease.Check), nil while
	// its trust window is open.
	LeaseErr error
	Restarts int // attempts already run again after a trust-deadline stop
}

// AttemptDecision is DecideAttempt's answer; Cause is the steal's, for AttemptSteal.
type AttemptDecision struct {
	Action AttemptAction
	Cause  error
}

// DecideAttempt is what the attempt loop does once an attempt has ended. A step that its
// init stopped at the lease's trust deadline (steps.ErrTrustDeadline) did not fail: if
// the lease's own check agrees the window closed, the epoch is over (the kill switch
// fires on the worker's side too); if the lease holds, a renewal came after the init's
// copy of the deadline, and the step runs again without spending an attempt of the
// user's retry policy, up to MaxTrustRestarts times. Writing its failure instead would
// fail a run whose lease never lapsed.
func DecideAttempt(s AttemptState) AttemptDecision {
	switch {
	case s.Err == nil:
		return AttemptDecision{Action: AttemptDone}
	case s.EpochEnded:
		return AttemptDecision{Action: AttemptEpochEnded}
	case errors.Is(s.Err, steps.ErrTrustDeadline):
		if s.LeaseErr != nil {
			return AttemptDecision{Action: AttemptSteal, Cause: s.LeaseErr}
		}
		if s.Restarts >= MaxTrustRestarts {
			return AttemptDecision{Action: AttemptSteal, Cause: fmt.Errorf("%w: the step's init stopped it at its trust deadline %d times in a row while the lease held: renewals reach this node too late",
				epoch.ErrLeaseLost, s.Restarts+1)}
		}
		return AttemptDecision{Action: AttemptAgain}
	case steps.IsPermanent(s.Err) || s.Attempt >= s.Max:
		return AttemptDecision{Action: AttemptFail}
	}
	return AttemptDecision{Action: AttemptRetry}
}
