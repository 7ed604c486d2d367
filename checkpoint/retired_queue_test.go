package checkpoint

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// A run that ends and is retired in one message (an operator's cancel and the leader's
// retire packed into one message by the group commit) leaves the admission queue and
// the held count, and the status hook hears that it ended, as when the two come in two
// messages. Found by TestQueueMatchesAScan once the random log wrote retires (issue 30):
// the run stayed queued, or held, until the node restarted, and a worker executing it
// was never told to stop.
func TestRunEndedAndRetiredInOneMessageLeavesTheQueue(t *testing.T) {
	for _, c := range []struct {
		name    string
		before  []Entry // after the submit, each its own message
		end     []Entry // in one message with the retire
		heard   RunStatus
		claimed bool
	}{
		{name: "queued, cancelled", end: []Entry{{Kind: KindCancel, Run: "r", Reason: "operator", At: t0}}, heard: StatusCancelled},
		{name: "assigned, cancelled", before: []Entry{{Kind: KindAssign, Run: "r", Term: 1, At: t0}},
			end: []Entry{{Kind: KindCancel, Run: "r", Reason: "operator", At: t0}}, heard: StatusCancelled},
		{name: "running, dead-lettered and purged", claimed: true,
			end:   []Entry{{Kind: KindDeadLetter, Run: "r", Term: 1, Reason: "poison", At: t0}, {Kind: KindPurge, Run: "r", At: t0}},
			heard: StatusCancelled},
	} {
		t.Run(c.name, func(t *testing.T) {
			heard := map[string]RunStatus{}
			s, err := OpenStore("state", StoreOptions{FS: vfs.NewMem(), OnStatus: func(run string, st RunStatus) { heard[run] = st }})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			mustApply(t, s, submitEntry("r", StepSpec{Name: "a"}))
			for _, e := range c.before {
				mustApply(t, s, e)
			}
			if c.claimed {
				seq := mustApply(t, s, Entry{Kind: KindAssign, Run: "r", Term: 1, At: t0})
				mustApply(t, s, Entry{Kind: KindClaim, Run: "r", Epoch: int64(seq), Owner: "w1", At: t0})
			}
			var datas [][]byte
			for _, e := range append(c.end, Entry{Kind: KindRetire, Run: "r", Term: 1, At: t0}) {
				datas = append(datas, mustJSON(t, e))
			}
			res, err := s.Apply(s.Applied()+1, EncodeJSONEnvelope("test", 2, datas))
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range res {
				if v != nil {
					t.Fatalf("entry %d: %v", i, v)
				}
			}
			if _, err := s.Run("r"); err == nil {
				t.Fatal("the run was not retired")
			}
			if assigned, running := s.Held(); assigned != 0 || running != 0 || s.QueuedRuns() != 0 {
				t.Errorf("after the run ended and was retired: held %d assigned, %d running, %d queued; want none", assigned, running, s.QueuedRuns())
			}
			if heard["r"] != c.heard {
				t.Errorf("the status hook heard %q of the run, want %q", heard["r"], c.heard)
			}
			n := 0
			if err := s.EachQueued(func(*Run) QueueVerdict { n++; return QueueNext }); err != nil || n != 0 {
				t.Errorf("EachQueued gave %d runs (%v), want none", n, err)
			}
		})
	}
}
