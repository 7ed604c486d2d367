package engine

import (
	"fmt"
	"slices"
	"testing"

	"github.com/flowrun/flow/checkpoint"
)

// effect is one side effect a step recorded outside the store: which run, step and item
// ran, in which epoch, and its position in the record.
type effect struct {
	Run   string
	Step  string
	Item  int
	Epoch int64
	Line  int
}

func (e effect) key() stepItem { return stepItem{e.Step, e.Item} }

type stepItem struct {
	Step string
	Item int
}

// parseEffects reads the helper's record lines, "<run> <step> <item> <epoch>".
func parseEffects(t *testing.T, lines []string) []effect {
	t.Helper()
	out := make([]effect, 0, len(lines))
	for i, l := range lines {
		e := effect{Line: i}
		if n, err := fmt.Sscanf(l, "%s %s %d %d", &e.Run, &e.Step, &e.Item, &e.Epoch); n != 4 || err != nil {
			t.Fatalf("record line %d %q: %v", i+1, l, err)
		}
		out = append(out, e)
	}
	return out
}

// acceptedEpochs returns, for each (step, item) of the run, the epoch of its accepted
// commit (its checkpoint), from the run's history; a second accepted commit is an error.
func acceptedEpochs(t *testing.T, v *checkpoint.RunView) map[stepItem]int64 {
	t.Helper()
	out := map[stepItem]int64{}
	for _, ev := range v.Events {
		if ev.Kind != checkpoint.KindCommit || ev.Outcome != "accepted" {
			continue
		}
		k := stepItem{ev.Step, ev.Item}
		if e, ok := out[k]; ok {
			t.Errorf("%s %s item %d: checkpointed twice, in epochs %d and %d", v.Run.ID, ev.Step, ev.Item, e, ev.Epoch)
		}
		out[k] = ev.Epoch
	}
	return out
}

// checkResumed checks one run's side effects against its checkpoints and epochs:
//
//   - (a) a (step, item) checkpointed in epoch E has no side effect in an epoch after E
//     (nothing checkpointed runs again), and exactly one in E;
//   - (b) a side effect in an epoch before E is one inFlight accepts (the step was in flight
//     when that epoch was killed or drained), and the step's next side effect is in the
//     run's next epoch: the killed epoch and the next one, nothing in between skipped.
//
// Every effect must belong to a checkpointed (step, item). It returns the number of
// repeats (side effects before the checkpoint's epoch).
func checkResumed(t *testing.T, v *checkpoint.RunView, effects []effect, inFlight func(effect) bool) int {
	t.Helper()
	cp := acceptedEpochs(t, v)
	var epochs []int64
	for _, r := range v.Run.Epochs {
		epochs = append(epochs, r.Epoch)
	}
	next := func(e int64) int64 {
		if i := slices.Index(epochs, e); i >= 0 && i+1 < len(epochs) {
			return epochs[i+1]
		}
		return -1
	}
	by := map[stepItem][]effect{}
	for _, e := range effects {
		if e.Run == v.Run.ID {
			by[e.key()] = append(by[e.key()], e)
		}
	}
	repeats := 0
	for k, es := range by {
		E, ok := cp[k]
		if !ok {
			t.Errorf("%s %s item %d ran (epochs %v) but has no checkpoint", v.Run.ID, k.Step, k.Item, effectEpochs(es))
			continue
		}
		inE := 0
		for i, e := range es {
			switch {
			case e.Epoch > E:
				t.Errorf("%s %s item %d ran again in epoch %d (record line %d) after its checkpoint in epoch %d (all its epochs %v; run epochs %v)",
					v.Run.ID, k.Step, k.Item, e.Epoch, e.Line+1, E, effectEpochs(es), epochs)
			case e.Epoch == E:
				inE++
			default:
				repeats++
				if !inFlight(e) {
					t.Errorf("%s %s item %d ran in epoch %d (record line %d), before its checkpoint in epoch %d, although it was not in flight when that epoch ended (all its epochs %v)",
						v.Run.ID, k.Step, k.Item, e.Epoch, e.Line+1, E, effectEpochs(es))
				}
				if i+1 < len(es) && es[i+1].Epoch != next(e.Epoch) {
					t.Errorf("%s %s item %d ran in epoch %d and then in epoch %d, not in the run's next epoch %d (run epochs %v)",
						v.Run.ID, k.Step, k.Item, e.Epoch, es[i+1].Epoch, next(e.Epoch), epochs)
				}
			}
		}
		if inE != 1 {
			t.Errorf("%s %s item %d ran %d times in its checkpoint's epoch %d", v.Run.ID, k.Step, k.Item, inE, E)
		}
	}
	return repeats
}

func effectEpochs(es []effect) []int64 {
	var out []int64
	for _, e := range es {
		out = append(out, e.Epoch)
	}
	return out
}

// checkNoFenced fails if the run has any fenced write: in a test without a zombie (a
// killed process is dead, a drained one wrote its last entry), every write carried the
// run's current epoch.
func checkNoFenced(t *testing.T, v *checkpoint.RunView) {
	t.Helper()
	if len(v.Fenced) != 0 || v.Run.Fenced != 0 {
		t.Errorf("%s: %d fenced writes (count %d) where no zombie exists: %+v", v.Run.ID, len(v.Fenced), v.Run.Fenced, v.Fenced)
	}
}
