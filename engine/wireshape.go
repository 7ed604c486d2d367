package engine

import (
	"encoding/json"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/workflow"
)

// The contract's JSON shapes of runs, workflows and ticks (../shared/CONTRACT.md): the
// state's records turned into client's wire types, for API (wire.go) and the verbs
// that answer with runs.

// tsOrNull is tsNano (a step can take less than a second), or nil (JSON null) for the
// zero time.
func tsOrNull(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := tsNano(t)
	return &s
}

// tsNano is ts with the fraction of the second (history events: steps take less than one).
func tsNano(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// ts is a time as the wire has it ("" for none).
func ts(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// wireRun is a run as the wire has it (with steps and fenced commits when v has them).
func wireRun(r *checkpoint.Run, v *checkpoint.RunView) client.Run {
	out := client.Run{ID: r.ID, Workflow: r.Workflow, Version: r.Version, Status: string(r.Status), Trigger: r.Trigger,
		ScheduledAt: ts(r.ScheduledAt), Epoch: r.Epoch, EpochChanges: r.EpochChanges, MaxEpochs: r.MaxEpochs, Priority: r.Priority,
		Owner: r.Owner, Error: r.Error, FailedStep: r.FailedStep, DeadLetter: r.DeadLetter,
		CreatedAt: ts(r.CreatedAt), UpdatedAt: ts(r.UpdatedAt), Epochs: []client.Epoch{}, Fenced: []client.Fenced{},
		StartedBy: r.StartedBy, Waiting: wireWaiting(r), Inbox: []client.Signal{}, Decisions: []client.Decision{}}
	if p := r.Parent; p != nil {
		out.Parent = &client.Parent{Run: p.Run, Step: p.Step, Item: p.Item}
	}
	out.Children = r.Children
	out.StartedAt, out.EndedAt = tsOrNull(r.StartedAt), tsOrNull(r.EndedAt)
	if !r.Deadline.IsZero() {
		out.Deadline = &client.Deadline{At: ts(r.Deadline), Missed: r.DeadlineMissed}
	}
	out.Handlers = append([]string{}, r.HandlerRuns...)
	if len(r.Outputs) > 0 && json.Valid(r.Outputs) {
		out.Outputs = r.Outputs
	}
	for _, s := range r.Inbox {
		out.Inbox = append(out.Inbox, client.Signal{Seq: s.Seq, Name: s.Name, ID: s.ID, Data: s.Data, Sender: s.Sender, At: tsNano(s.At), ConsumedBy: s.ConsumedBy})
	}
	for _, d := range r.Decisions {
		out.Decisions = append(out.Decisions, client.Decision{Seq: d.Seq, Step: d.Step, Actor: d.Actor, Approve: d.Approve, Comment: d.Comment, At: tsNano(d.At)})
	}
	if len(r.Inputs) > 0 && json.Valid(r.Inputs) {
		out.Inputs = r.Inputs // as stored: decoding into any would round an int64 through float64
	}
	for _, e := range r.Epochs {
		out.Epochs = append(out.Epochs, client.Epoch{Epoch: e.Epoch, Owner: e.Owner, Reason: e.Reason, At: ts(e.At)})
	}
	if v != nil {
		out.Steps = []client.Step{}
		for _, s := range v.Steps {
			out.Steps = append(out.Steps, client.Step{Name: s.Name, Status: string(s.Status), Attempts: s.Attempts, Epoch: s.Epoch,
				Items: s.Items, ItemsDone: s.ItemsDone, Output: s.Output, Error: s.Error, StartedAt: tsOrNull(s.StartedAt), EndedAt: tsOrNull(s.EndedAt)})
		}
		for _, f := range v.Fenced {
			out.Fenced = append(out.Fenced, client.Fenced{Step: f.Step, Item: f.Item, Epoch: f.Epoch, CurrentEpoch: f.CurrentEpoch,
				Owner: f.Owner, Reason: f.Reason, At: ts(f.At)})
		}
	}
	return out
}

// wireWaiting is what a waiting run waits for, as the wire has it (nil unless it waits).
func wireWaiting(r *checkpoint.Run) *client.Waiting {
	w := r.Waiting
	if r.Status != checkpoint.StatusWaiting || w == nil {
		return nil
	}
	out := &client.Waiting{Kind: w.Kind, Step: w.Step, Since: ts(w.Since), Role: w.Role}
	if !w.Until.IsZero() {
		until := ts(w.Until)
		out.Until = &until
	}
	switch w.Kind {
	case checkpoint.WaitSignal:
		out.Signal = w.Name
	case checkpoint.WaitApproval:
		out.Need = w.Need
		out.ApprovedBy, _, _ = r.Approvals(w.Step, w.Rule())
	case checkpoint.WaitChild:
		out.Children = w.Children
	case checkpoint.WaitConcurrency: // its first key until showKeyWaits names the full one
		if len(w.Keys) > 0 {
			out.Key, out.Limit = w.Keys[0].Key, w.Keys[0].Limit
		}
	}
	return out
}

// wireRuns are runs as the wire has them, without their steps.
func wireRuns(runs []checkpoint.Run) []client.Run {
	out := make([]client.Run, 0, len(runs))
	for i := range runs {
		out = append(out, wireRun(&runs[i], nil))
	}
	return out
}

// wireWorkflow is a workflow version as the wire has it (with its YAML if source).
func wireWorkflow(w *workflow.Workflow, source bool) client.Workflow {
	out := client.Workflow{Name: w.Name, Version: w.Version, Description: w.Description, Steps: len(w.Steps)}
	if w.Schedule != nil {
		out.Schedule = w.Schedule.Cron + " " + w.Schedule.Timezone
	}
	if source {
		out.Source = w.Source
	}
	return out
}

func wireTick(t checkpoint.Tick) client.Tick {
	return client.Tick{At: ts(t.At), Outcome: t.Outcome, RunID: t.RunID, Term: t.Term, Owner: t.Owner}
}
