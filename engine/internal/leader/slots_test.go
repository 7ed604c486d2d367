package leader

import (
	"testing"

	"github.com/flowrun/flow/checkpoint"
)

// PlanGrants grants in park order, every key of a step together, each only while all
// of its keys have room (counting the grants it made), and passes over a waiter whose
// key is full for the next, whose keys may have room.
func TestPlanGrantsInParkOrder(t *testing.T) {
	w := func(run string, seq uint64, keys ...checkpoint.SlotKey) checkpoint.SlotWaiter {
		return checkpoint.SlotWaiter{Run: run, Step: "pay", ParkSeq: seq, Keys: keys}
	}
	x1, y1, bank2 := checkpoint.SlotKey{Key: "x", Limit: 1}, checkpoint.SlotKey{Key: "y", Limit: 1}, checkpoint.SlotKey{Key: "bank", Limit: 2}
	counts := KeyCounts{"y": 1} // y is held (by a run of a workflow key, or a step)
	grants := PlanGrants([]checkpoint.SlotWaiter{
		w("a", 3, x1, bank2), // granted: x and bank have room
		w("b", 4, x1),        // x is now full
		w("c", 5, y1),        // y was full before the pass
		w("d", 6, bank2),     // bank has one slot left
		w("e", 7, bank2),     // and now none
	}, counts)
	var got []string
	for _, g := range grants {
		got = append(got, g.Run)
	}
	if len(got) != 2 || got[0] != "a" || got[1] != "d" {
		t.Fatalf("granted %v; want [a d]", got)
	}
	if counts["x"] != 1 || counts["bank"] != 2 || counts["y"] != 1 {
		t.Fatalf("counts after the pass %v; want x 1, bank 2, y 1 (the grants counted in, for the admission that follows)", counts)
	}
	if e := GrantEntry(grants[0]); e.Kind != checkpoint.KindWake || e.ParkSeq != 3 || e.Step != "pay" || e.Item != checkpoint.ItemWhole {
		t.Fatalf("grant entry %+v", e)
	}
}
