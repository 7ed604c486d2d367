package workflow

import "time"

// Handlers: `on_failure:`, `on_dead_letter:` and `on_deadline:` are lists of
// ordinary steps. Each event of a run (it failed, it was dead-lettered, it missed its
// deadline) starts one handler run of its list, checkpointed and fenced like any run;
// its templates see the run that had the event as run.id, run.error and
// run.failed_step. A handler's outcome does not change the run's.

// The handler events, as workflow keys (and in handler run IDs, with '-').
const (
	OnFailure    = "on_failure"
	OnDeadLetter = "on_dead_letter"
	OnDeadline   = "on_deadline"
)

// HandlerEvents are the events, in a stable order.
var HandlerEvents = []string{OnFailure, OnDeadLetter, OnDeadline}

// HandledTick is the tick a handler run handles when no run of it ever started: the run
// ID it would have had, its time, its deadline, and why it never ran.
type HandledTick struct {
	Run      string    `json:"run"`
	Tick     time.Time `json:"tick"`
	Deadline time.Time `json:"deadline"`
	Why      string    `json:"why"`
}

// HandlerWorkflow is the workflow a handler run of event runs: w's inputs and schedule,
// the event's steps, no handlers of its own, no deadline, no outputs; nil if w has none
// for event.
func (w *Workflow) HandlerWorkflow(event string) *Workflow {
	steps := w.Handlers[event]
	if len(steps) == 0 {
		return nil
	}
	hw := &Workflow{Name: w.Name, Description: w.Description, MaxEpochs: w.MaxEpochs, Timeout: w.Timeout, Inputs: w.Inputs, RunsOn: w.RunsOn, Priority: w.Priority,
		Schedule: w.Schedule, Steps: steps, Source: w.Source, Version: w.Version, Digest: w.Digest, byName: map[string]*Step{}}
	for _, st := range steps {
		hw.byName[st.Name] = st
	}
	return hw
}
