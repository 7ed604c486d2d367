package apiserver

import (
	"slices"
	"testing"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine"
)

// The engine's API adapter is the Node flowd serves.
var _ Node = (*engine.API)(nil)

// run.list checks a status against the wire's statuses without asking the node: they
// are exactly the run statuses the state machine has.
func TestRunStatusesAreTheStates(t *testing.T) {
	candidates := append(slices.Clone(runStatuses), "", "done", "Running", "dead-lettered", "assigned")
	for _, s := range candidates {
		if wire, state := slices.Contains(runStatuses, s), checkpoint.ValidRunStatus(checkpoint.RunStatus(s)); wire != state {
			t.Errorf("status %q: the API takes it %v, the state machine has it %v", s, wire, state)
		}
	}
	if deadLettered != string(checkpoint.StatusDeadLettered) {
		t.Errorf("the dead-letter queue's status %q; the state machine's %q", deadLettered, checkpoint.StatusDeadLettered)
	}
}
