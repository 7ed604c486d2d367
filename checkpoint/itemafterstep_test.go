package checkpoint

import (
	"encoding/json"
	"errors"
	"testing"
)

// A foreach step checkpointed as a whole takes no more item writes: a commit or a
// failure of one of its items is fenced (checkpoint-exists), as one of the whole step
// is. Found by TestFencingInvariantsProperty (issue 30, once in about 11,000 cases,
// -rapid.seed=10463478063218839567): a final failure of an item was accepted after the
// step's checkpoint and marked the step failed, an operator's retry made it pending, and
// a second commit of the step was accepted (invariant 1).
func TestItemWritesAfterTheStepsCheckpointAreFenced(t *testing.T) {
	for _, c := range []struct {
		name string
		e    Entry // Epoch and Owner filled in
	}{
		{"final fail of an item", Entry{Kind: KindFail, Step: "b", Item: 1, Error: "boom", Final: true}},
		{"fail of an item", Entry{Kind: KindFail, Step: "b", Item: 1, Error: "boom"}},
		{"commit of an item", Entry{Kind: KindCommit, Step: "b", Item: 1, Output: json.RawMessage(`{}`)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := memStore(t, nil)
			mustApply(t, s, submitEntry("r", StepSpec{Name: "b", Foreach: true}))
			epoch := int64(mustApply(t, s, Entry{Kind: KindAssign, Run: "r", Term: 1, Worker: "w", At: t0}))
			w := func(e Entry) Entry { e.Run, e.Epoch, e.Owner, e.At = "r", epoch, "w", t0; return e }
			mustApply(t, s, w(Entry{Kind: KindStart, Step: "b", Item: ItemWhole, Items: 3}))
			mustApply(t, s, w(Entry{Kind: KindCommit, Step: "b", Item: 0, Output: json.RawMessage(`{}`)}))
			mustApply(t, s, w(Entry{Kind: KindCommit, Step: "b", Item: ItemWhole, Output: json.RawMessage(`{}`)}))
			_, err := applyOne(t, s, w(c.e))
			var fe *FencedError
			if !errors.As(err, &fe) || fe.Reason != "checkpoint-exists" {
				t.Fatalf("%s after the step's checkpoint: %v; want fenced, checkpoint-exists", c.name, err)
			}
			v, err := s.View("r")
			if err != nil {
				t.Fatal(err)
			}
			if st := v.Steps[0]; st.Status != StepSucceeded || st.ItemsDone != 1 || len(st.ItemCheckpoints) != 1 {
				t.Fatalf("the checkpointed step changed: %s, %d items done, %d item records", st.Status, st.ItemsDone, len(st.ItemCheckpoints))
			}
			// What the hole allowed: a retry, a new epoch, and a second commit of the step.
			mustApply(t, s, Entry{Kind: KindComplete, Run: "r", Epoch: epoch, Owner: "w", Status: StatusFailed, At: t0})
			mustApply(t, s, Entry{Kind: KindRetry, Run: "r", At: t0})
			epoch = int64(mustApply(t, s, Entry{Kind: KindAssign, Run: "r", Term: 1, Epoch: epoch, Worker: "w", At: t0}))
			if _, err := applyOne(t, s, w(Entry{Kind: KindCommit, Step: "b", Item: ItemWhole, Output: json.RawMessage(`{"again":1}`)})); !errors.Is(err, ErrFenced) {
				t.Fatalf("a second commit of the checkpointed step: %v; want fenced", err)
			}
		})
	}
}
