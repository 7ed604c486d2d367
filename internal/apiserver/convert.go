package apiserver

import (
	"encoding/json"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
)

// tsNano is ts with the fraction of the second (history events: steps take less than one).
func tsNano(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func ts(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// runJSON builds the JSON shape of a run (steps and fenced commits when v has them).
func runJSON(r *checkpoint.Run, v *checkpoint.RunView) client.Run {
	out := client.Run{ID: r.ID, Workflow: r.Workflow, Version: r.Version, Status: string(r.Status), Trigger: r.Trigger,
		ScheduledAt: ts(r.ScheduledAt), Epoch: r.Epoch, EpochChanges: r.EpochChanges, MaxEpochs: r.MaxEpochs,
		Owner: r.Owner, Error: r.Error, FailedStep: r.FailedStep, DeadLetter: r.DeadLetter,
		CreatedAt: ts(r.CreatedAt), UpdatedAt: ts(r.UpdatedAt), Epochs: []client.Epoch{}, Fenced: []client.Fenced{}}
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
				Items: s.Items, ItemsDone: s.ItemsDone, Output: s.Output, Error: s.Error})
		}
		for _, f := range v.Fenced {
			out.Fenced = append(out.Fenced, client.Fenced{Step: f.Step, Item: f.Item, Epoch: f.Epoch, CurrentEpoch: f.CurrentEpoch,
				Owner: f.Owner, Reason: f.Reason, At: ts(f.At)})
		}
	}
	return out
}
