package leader

import (
	"testing"

	"github.com/flowrun/flow/internal/base/testhooks"
)

// The short path does not pass waiting runs: not those the last pass left for want of
// room (backlogged), nor those submitted since it, which no pass has seen (queued above
// what it left); runs its limits held back do not close it. Control: AdmitPastWaiting.
func TestAdmitDoesNotPassWaitingRuns(t *testing.T) {
	assigned := func() int { return 0 }
	queued := 0
	q := func() int { return queued }
	for _, c := range []struct {
		name       string
		backlogged bool
		left, now  int
		want       bool
	}{
		{"nothing waits", false, 0, 0, true},
		{"runs held back by their limits", false, 3, 3, true},
		{"a run submitted since the pass", false, 0, 1, false},
		{"held back, and one more since", false, 3, 4, false},
		{"the pass ran out of room", true, 5, 5, false},
	} {
		for _, control := range []bool{false, true} {
			h := new(testhooks.Hooks)
			h.AdmitPastWaiting.Store(control)
			a := NewAdmission(8, h)
			a.PassEnded(c.backlogged, c.left)
			queued = c.now
			want := c.want || control
			if got := a.Admit(assigned, q); got != want {
				t.Errorf("%s (control %v): Admit = %v, want %v", c.name, control, got, want)
			}
		}
	}
}
