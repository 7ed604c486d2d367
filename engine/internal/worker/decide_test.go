package worker

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/workflow"
)

func TestReadySteps(t *testing.T) {
	w, err := workflow.Load("d.yaml", []byte(`name: d
steps:
  - name: a
    uses: noop
  - name: b
    needs: [a]
    uses: noop
  - name: c
    needs: [a]
    uses: noop
  - name: d
    needs: [b, c]
    uses: noop
  - name: e
    uses: noop
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	set := func(names string) map[string]bool {
		m := map[string]bool{}
		for _, n := range strings.Fields(names) {
			m[n] = true
		}
		return m
	}
	for _, c := range []struct {
		done, running string
		parallelism   int
		failing       bool
		want          string
	}{
		{"", "", 8, false, "a e"},       // the roots, in the workflow's order
		{"", "", 1, false, "a"},         // room for one
		{"", "a", 2, false, "e"},        // a runs: one slot left
		{"", "a e", 2, false, ""},       // full
		{"", "a e", 8, false, ""},       // both roots run: their dependents wait
		{"a", "", 8, false, "b c e"},    // a's dependents
		{"a", "", 2, false, "b c"},      // the first ready ones fill the room
		{"a", "e", 8, false, "b c"},     // siblings start beside a running step
		{"a", "b c e", 8, false, ""},    // d waits for b and c
		{"a b", "c", 8, false, "e"},     // d waits for c
		{"a c", "", 8, false, "b e"},    // d waits for b
		{"a b c", "", 8, false, "d e"},  // all of d's needs done
		{"a b c", "", 0, false, ""},     // no room at all
		{"a b c e", "d", 8, false, ""},  // the last one runs
		{"a b c d e", "", 8, false, ""}, // nothing left
		{"a", "", 8, true, ""},          // a failing run starts nothing
		{"b c", "", 8, false, "a d e"},  // readiness is the needs' alone
		{"x", "", 8, false, "a e"},      // a name the workflow does not have changes nothing
		{"", "x", 2, false, "a"},        // but a running one takes room
		{"a e", "", 1, false, "b"},      // one at a time, in the workflow's order
		{"a b e", "", 1, false, "c"},    //
		{"a b c e", "", 1, false, "d"},  //
	} {
		done, running := set(c.done), set(c.running)
		got := readySteps(w, func(s string) bool { return done[s] }, running, c.parallelism, c.failing)
		var names []string
		for _, st := range got {
			names = append(names, st.Name)
		}
		if !slices.Equal(names, strings.Fields(c.want)) {
			t.Errorf("done %q, running %q, parallelism %d, failing %v: ready %v, want %q", c.done, c.running, c.parallelism, c.failing, names, c.want)
		}
	}
}

func TestDecideEnd(t *testing.T) {
	lost := fmt.Errorf("%w: renewal failed", epoch.ErrLeaseLost)
	boom := errors.New("exit status 1")
	drained := fmt.Errorf("%w", errDrain)
	for _, c := range []struct {
		name string
		s    endState
		want endAction
		step string
		msg  string
		why  error
	}{
		{"all done", endState{done: 3, total: 3}, endSucceeded, "", "", nil},
		{"stolen first", endState{stolen: true, failedErr: boom, done: 1, total: 3}, endNothing, "", "", nil},
		{"completed with the last commit", endState{completed: true, cause: drained, done: 3, total: 3}, endNothing, "", "", nil},
		{"ended from outside (cancelled)", endState{ended: true, cause: boom, done: 1, total: 3}, endNothing, "", "", nil},
		{"drained", endState{cause: drained, done: 1, total: 3}, endHandBack, "", "", nil},
		{"a step saw the drain", endState{failedStep: "b", failedErr: drained, done: 1, total: 3}, endHandBack, "", "", nil},
		{"a step failed while the lease was lost", endState{failedStep: "b", failedErr: boom, leaseCause: lost, done: 1, total: 3}, endSteal, "", "", lost},
		{"a step failed", endState{failedStep: "b", failedErr: boom, done: 1, total: 3}, endFailed, "b", "exit status 1", nil},
		{"stopped early: lease lost", endState{cause: lost, done: 1, total: 3}, endSteal, "", "", lost},
		{"stopped early: run timeout", endState{cause: errors.New("run timeout 1s"), done: 1, total: 3}, endFailed, "", "run timeout 1s", nil},
	} {
		d := decideEnd(c.s)
		if d.action != c.want || d.step != c.step || d.msg != c.msg || d.cause != c.why {
			t.Errorf("%s: %+v; want action %d, step %q, msg %q, cause %v", c.name, d, c.want, c.step, c.msg, c.why)
		}
	}
}
