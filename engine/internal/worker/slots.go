package worker

import (
	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/workflow"
)

// Step slots (checkpoint/slots.go): a step with concurrency keys runs only when its run
// holds a slot of each, by this node's state, freshly read. Without them the step asks
// to park on them (a *parkRequest of kind concurrency): the epoch lets its running
// siblings finish and parks the run; the leader's grant wakes it, and the resumed epoch
// finds the slots here and runs the step. Its commit gives them back.

// stepSlots returns nil when the run holds st's slots, else the park that waits for
// them (or the state's read error). scope is st's template scope.
func (x *runExec) stepSlots(st *workflow.Step, scope map[string]any) error {
	if len(st.Concurrency) == 0 || x.p.hooks.NoStepSlots.Load() { // the control runs it without them
		return nil
	}
	inputs, _ := scope["inputs"].(map[string]any)
	kl := st.Keys(inputs)
	keys := make([]checkpoint.SlotKey, len(kl))
	for i, k := range kl {
		keys[i] = checkpoint.SlotKey{Key: k.Key, Limit: k.Limit}
	}
	r, err := x.p.cfg.State.Run(x.run.ID)
	if err != nil {
		return err
	}
	if r.HoldsSlots(st.Name, keys) {
		return nil
	}
	x.p.stats.SlotWaits.Add(1)
	return &parkRequest{step: st.Name, wait: checkpoint.Wait{Kind: checkpoint.WaitConcurrency, Keys: keys}}
}
