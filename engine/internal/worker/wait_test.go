package worker

import (
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/workflow"
)

// Sibling waits that ask to park together park the run on one wait chosen by what they
// are, whatever order they asked in: the one due first (one without a time last), then
// the step first in the workflow's order.
func TestParkFirstIsTheOrderOfTheWaitsNotOfTheAsking(t *testing.T) {
	x := &runExec{wf: &workflow.Workflow{Steps: []*workflow.Step{{Name: "a"}, {Name: "b"}, {Name: "c"}}}}
	t0 := time.Date(2026, 12, 6, 2, 0, 0, 0, time.UTC)
	req := func(step string, until time.Time) *parkRequest {
		return &parkRequest{step: step, wait: checkpoint.Wait{Kind: checkpoint.WaitTimer, Until: until}}
	}
	cases := []struct {
		name   string
		waits  []*parkRequest
		parked string
	}{
		{"both untimed: workflow order", []*parkRequest{req("b", time.Time{}), req("a", time.Time{})}, "a"},
		{"a timed one before an untimed one", []*parkRequest{req("a", time.Time{}), req("c", t0.Add(time.Hour))}, "c"},
		{"the earlier of two times", []*parkRequest{req("a", t0.Add(time.Hour)), req("b", t0.Add(time.Second))}, "b"},
		{"equal times: workflow order", []*parkRequest{req("c", t0), req("b", t0)}, "b"},
		{"three", []*parkRequest{req("a", time.Time{}), req("c", t0.Add(time.Minute)), req("b", t0.Add(time.Minute))}, "b"},
	}
	for _, c := range cases {
		// Every order of asking parks on the same wait.
		for _, perm := range permutations(len(c.waits)) {
			var parked *parkRequest
			for _, i := range perm {
				parked = x.parkFirst(parked, c.waits[i])
			}
			if parked.step != c.parked {
				t.Errorf("%s: asked in order %v, parked on %s, want %s", c.name, perm, parked.step, c.parked)
			}
		}
	}
}

func permutations(n int) [][]int {
	if n == 1 {
		return [][]int{{0}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := append(append(append([]int{}, p[:i]...), n-1), p[i:]...)
			out = append(out, q)
		}
	}
	return out
}
