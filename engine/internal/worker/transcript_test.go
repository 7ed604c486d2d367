package worker

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/tasks"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/steps"
	"github.com/flowrun/flow/workflow"
)

// The workers' decisions as transcripts (testdata/*.txt), read as their specification;
// `go test -run TestTranscripts -rewrite` regenerates the expected output.
//
// Commands:
//
//	workflow                      the workflow the next commands decide on (its YAML)
//	ready [done=a,b] [running=c] [parallelism=N] [failing]
//	                              ReadySteps: which steps start now, in order
//	end [stolen] [completed] [ended] [cause=C] [lease=C] [failed=STEP:C] done=N total=N
//	                              DecideEnd: what the epoch does once no step runs; a
//	                              cause C is drain, lease-lost, timeout or boom
//	attempt [err=C] attempt=N max=N [epoch-ended] [lease=C] [restarts=N]
//	                              DecideAttempt: what the attempt loop does once an
//	                              attempt ended; C also trust-deadline or permanent
//	task epoch=E status=S [owner=O] task=T   JudgeTask on a run in that state ("task
//	                              run=none task=T" for a run this node does not have)

func TestTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var wf *workflow.Workflow
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "workflow":
				w, err := workflow.Load("wf.yaml", []byte(d.Input), nil)
				if err != nil {
					d.Fatalf(t, "workflow: %v", err)
				}
				wf = w
				return "ok"
			case "ready":
				done, running := set(d, "done"), set(d, "running")
				parallelism := 8
				if d.HasArg("parallelism") {
					d.ScanArgs(t, "parallelism", &parallelism)
				}
				got := ReadySteps(wf, func(s string) bool { return done[s] }, running, parallelism, d.HasArg("failing"))
				var names []string
				for _, st := range got {
					names = append(names, st.Name)
				}
				if len(names) == 0 {
					return "none"
				}
				return strings.Join(names, " ")
			case "end":
				s := EndState{Stolen: d.HasArg("stolen"), Completed: d.HasArg("completed"), Ended: d.HasArg("ended"),
					Cause: causeArg(t, d, "cause"), LeaseCause: causeArg(t, d, "lease")}
				if d.HasArg("failed") {
					var v string
					d.ScanArgs(t, "failed", &v)
					step, c, _ := strings.Cut(v, ":")
					s.FailedStep, s.FailedErr = step, cause(t, d, c)
				}
				d.ScanArgs(t, "done", &s.Done)
				d.ScanArgs(t, "total", &s.Total)
				return endText(DecideEnd(s))
			case "attempt":
				s := AttemptState{Err: causeArg(t, d, "err"), EpochEnded: d.HasArg("epoch-ended"), LeaseErr: causeArg(t, d, "lease")}
				d.ScanArgs(t, "attempt", &s.Attempt)
				d.ScanArgs(t, "max", &s.Max)
				if d.HasArg("restarts") {
					d.ScanArgs(t, "restarts", &s.Restarts)
				}
				return attemptText(DecideAttempt(s))
			case "task":
				var r *checkpoint.Run
				var tk tasks.Task
				d.ScanArgs(t, "task", &tk.Epoch)
				if !d.HasArg("run") {
					r = &checkpoint.Run{}
					var status string
					d.ScanArgs(t, "epoch", &r.Epoch)
					d.ScanArgs(t, "status", &status)
					r.Status = checkpoint.RunStatus(status)
					if d.HasArg("owner") {
						d.ScanArgs(t, "owner", &r.Owner)
					}
				}
				return [...]string{TaskNotYet: "not yet: look again later", TaskStale: "stale: ack and drop", TaskTake: "take: lease, then claim"}[JudgeTask(r, tk)]
			}
			d.Fatalf(t, "unknown command %q", d.Cmd)
			return ""
		})
	})
}

func set(d *datadriven.TestData, key string) map[string]bool {
	m := map[string]bool{}
	for _, a := range d.CmdArgs {
		if a.Key == key {
			for _, v := range a.Vals {
				m[v] = true
			}
		}
	}
	return m
}

func causeArg(t *testing.T, d *datadriven.TestData, key string) error {
	if !d.HasArg(key) {
		return nil
	}
	var v string
	d.ScanArgs(t, key, &v)
	return cause(t, d, v)
}

// cause names the errors an epoch ends with.
func cause(t *testing.T, d *datadriven.TestData, name string) error {
	switch name {
	case "drain":
		return fmt.Errorf("%w", ErrDrain)
	case "lease-lost":
		return fmt.Errorf("%w: renewal failed", epoch.ErrLeaseLost)
	case "timeout":
		return errors.New("run timeout 1s")
	case "boom":
		return errors.New("exit status 1")
	case "trust-deadline":
		return fmt.Errorf("signal: terminated (%w)", steps.ErrTrustDeadline)
	case "permanent":
		return steps.Permanentf("unknown step kind %q on this node", "nope")
	}
	d.Fatalf(t, "unknown cause %q", name)
	return nil
}

func attemptText(a AttemptDecision) string {
	switch a.Action {
	case AttemptDone:
		return "done: checkpoint the output"
	case AttemptEpochEnded:
		return "epoch ended: return its cause, record nothing"
	case AttemptSteal:
		return fmt.Sprintf("stop: %s (%v)", ReasonStolen, a.Cause)
	case AttemptAgain:
		return "run it again, uncounted"
	case AttemptRetry:
		return "retry after the backoff (a fail note)"
	case AttemptFail:
		return "fail the step (recorded, final)"
	}
	return fmt.Sprintf("unknown action %d", a.Action)
}

func endText(e EndDecision) string {
	switch e.Action {
	case EndNothing:
		return "nothing: the epoch is settled"
	case EndHandBack:
		return "hand back (requeue, not counted)"
	case EndSteal:
		return fmt.Sprintf("stop: %s (%v)", ReasonStolen, e.Cause)
	case EndFailed:
		return fmt.Sprintf("complete failed: step %q: %s", e.Step, e.Msg)
	case EndSucceeded:
		return "complete succeeded"
	}
	return fmt.Sprintf("unknown action %d", e.Action)
}
