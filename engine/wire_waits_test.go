package engine

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
)

// run get's waiting block (CONTRACT.md, issue 21): kind, step and until (null without a
// timer), plus the signal's name, or an approval's need and role; none once the run is no
// longer waiting. Inbox and decisions are arrays, empty when there are none.
func TestWireWaiting(t *testing.T) {
	at := time.Date(2026, 11, 29, 2, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		run  checkpoint.Run
		want string
	}{
		{checkpoint.Run{Status: checkpoint.StatusWaiting, Waiting: &checkpoint.Waiting{Wait: checkpoint.Wait{Kind: checkpoint.WaitSignal, Name: "go"}, Step: "w", Since: at}},
			`{"kind":"signal","step":"w","until":null,"signal":"go","since":"2026-11-29T02:00:00Z"}`},
		{checkpoint.Run{Status: checkpoint.StatusWaiting, Waiting: &checkpoint.Waiting{Wait: checkpoint.Wait{Kind: checkpoint.WaitApproval, Need: 2, Role: "operator", Exclude: "ann", Until: at.Add(time.Hour)}, Step: "ok", Since: at}},
			`{"kind":"approval","step":"ok","until":"2026-11-29T03:00:00Z","need":2,"role":"operator","since":"2026-11-29T02:00:00Z"}`},
		{checkpoint.Run{Status: checkpoint.StatusWaiting, Waiting: &checkpoint.Waiting{Wait: checkpoint.Wait{Kind: checkpoint.WaitTimer, Until: at}, Step: "nap", Since: at}},
			`{"kind":"timer","step":"nap","until":"2026-11-29T02:00:00Z","since":"2026-11-29T02:00:00Z"}`},
		{checkpoint.Run{Status: checkpoint.StatusPending, Waiting: &checkpoint.Waiting{Wait: checkpoint.Wait{Kind: checkpoint.WaitTimer, Until: at}, Step: "nap"}}, `null`},
	} {
		r := wireRun(&c.run, nil)
		if got, _ := json.Marshal(r.Waiting); string(got) != c.want {
			t.Errorf("waiting of %+v:\n got %s\nwant %s", c.run.Waiting, got, c.want)
		}
		if r.Inbox == nil || r.Decisions == nil {
			t.Errorf("inbox %v, decisions %v: want empty arrays", r.Inbox, r.Decisions)
		}
	}
	r := wireRun(&checkpoint.Run{StartedBy: "ann",
		Inbox:     []checkpoint.SignalRecord{{Seq: 7, Name: "go", ID: "k", Data: json.RawMessage(`{"a":1}`), Sender: "ann", At: at, ConsumedBy: "w", ConsumedEpoch: 3}},
		Decisions: []checkpoint.DecisionRecord{{Seq: 9, Step: "ok", Actor: "bob", Approve: true, Comment: "fine", At: at}}}, nil)
	want := client.Run{StartedBy: "ann",
		Inbox:     []client.Signal{{Seq: 7, Name: "go", ID: "k", Data: json.RawMessage(`{"a":1}`), Sender: "ann", At: "2026-11-29T02:00:00Z", ConsumedBy: "w"}},
		Decisions: []client.Decision{{Seq: 9, Step: "ok", Actor: "bob", Approve: true, Comment: "fine", At: "2026-11-29T02:00:00Z"}}}
	got, _ := json.Marshal(struct{ A, B, C any }{r.StartedBy, r.Inbox, r.Decisions})
	exp, _ := json.Marshal(struct{ A, B, C any }{want.StartedBy, want.Inbox, want.Decisions})
	if string(got) != string(exp) {
		t.Errorf("got %s\nwant %s", got, exp)
	}
}
