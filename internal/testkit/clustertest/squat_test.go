package clustertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
)

// Squatting a child's ID (issue 36), with a real flowd: a cron parent's and a backfilled
// parent's IDs are known in advance (<workflow>-<tick>), so their children's are too
// (<parent>.each). An operator once started a run of another workflow under such an ID
// before the parent reached its step, and the parent took the squatter's outputs
// ({"paid": 999999}) as its child's. Now the squat is refused (bad request: the ID is
// flow's), and each parent's child runs its own workflow. Control: flowd linked with the
// binding off (engine.noChildBinding, worker.noChildBinding): the squats are accepted and
// the parents adopt them, paying 999999.
func TestSquattedChildIsRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("starts flowd processes")
	}
	t.Parallel()
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "bound", true: "control-binding-off"}[control], func(t *testing.T) {
			url := startNATSServer(t)
			c := &Cluster{URLs: []string{url}}
			if control {
				startFlowdBin(t, c, "node-a", FlowdLinkedWith(t, "github.com/flowrun/flow/engine.noChildBinding=1",
					"github.com/flowrun/flow/engine/internal/worker.noChildBinding=1"), "--lease-ttl", "2s")
			} else {
				StartFlowd(t, c, "node-a", "--lease-ttl", "2s")
			}
			cl := dial(t, c)
			for _, yaml := range []string{
				"name: settle\noutputs:\n  paid: \"{{ steps.pay.output.paid }}\"\nsteps:\n  - {name: pay, uses: noop, with: {paid: 1}}\n",
				"name: fake\noutputs:\n  paid: \"{{ steps.pay.output.paid }}\"\nsteps:\n  - {name: pay, uses: noop, with: {paid: 999999}}\n",
				// Every 3 seconds: the next ticks' runs are squatted before they fire.
				"name: nightly\nschedule: {cron: \"*/3 * * * * *\", catchup: none}\noutputs:\n  paid: \"{{ steps.each.output.paid }}\"\nsteps:\n  - {name: each, uses: workflow, with: {workflow: settle}}\n",
				"name: hourly\nschedule: {cron: \"0 * * * *\", catchup: none}\noutputs:\n  paid: \"{{ steps.each.output.paid }}\"\nsteps:\n  - {name: each, uses: workflow, with: {workflow: settle}}\n",
			} {
				WaitFor(t, 30*time.Second, "the workflow applied", func() bool {
					return call(t, cl, "workflow.apply", client.Request{File: "w.yaml", YAML: yaml}, nil) == nil
				})
			}
			tickID := func(wf string, at time.Time) string { return wf + "-" + at.UTC().Format("20060102T150405Z") }
			squat := func(parent string) {
				err := call(t, cl, "run.start", client.Request{Workflow: "fake", ID: parent + ".each"}, nil)
				var ae *client.Error
				switch {
				case control && err != nil:
					t.Fatalf("control: the squat of %s.each: %v", parent, err)
				case !control && (!errors.As(err, &ae) || ae.Code != client.CodeBadRequest || !strings.Contains(ae.Message, "kept for the runs flow derives")):
					t.Fatalf("the squat of %s.each: %v; want it refused as flow's ID", parent, err)
				}
			}
			// The cron parent: squat the children of the next four ticks, at least two
			// seconds ahead, before they fire.
			next := time.Now().Truncate(3 * time.Second).Add(6 * time.Second)
			var cronParents []string
			for i := range 4 {
				id := tickID("nightly", next.Add(time.Duration(3*i)*time.Second))
				squat(id)
				cronParents = append(cronParents, id)
			}
			// The backfilled parent: squat, then backfill its tick.
			tick := time.Now().Add(-3 * time.Hour).Truncate(time.Hour)
			backfilled := tickID("hourly", tick)
			squat(backfilled)
			if err := call(t, cl, "cron.backfill", client.Request{Workflow: "hourly", From: tick.Format(time.RFC3339), To: tick.Format(time.RFC3339)}, nil); err != nil {
				t.Fatal(err)
			}
			for i, id := range append(cronParents, backfilled) {
				if i == len(cronParents) {
					// The squatted ticks have fired: no more runs every 3 s beside the
					// backfilled one (a loaded machine under -race once kept it waiting).
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					_, err := cl.PauseSchedule(ctx, "nightly", "the squatted ticks fired")
					cancel()
					if err != nil {
						t.Logf("pausing nightly: %v", err)
					}
				}
				var r client.Run
				t.Cleanup(func() {
					if t.Failed() && r.Status != "succeeded" {
						t.Logf("%s as last read: status %q, epochs %+v, waiting %+v, error %q", id, r.Status, r.Epochs, r.Waiting, r.Error)
					}
				})
				WaitFor(t, 2*time.Minute, id+" ended", func() bool {
					return call(t, cl, "run.get", client.Request{ID: id}, &r) == nil && (r.Status == "succeeded" || r.Status == "failed")
				})
				var out struct {
					Paid json.Number `json:"paid"`
				}
				_ = json.Unmarshal(r.Outputs, &out)
				var child client.Run
				if err := call(t, cl, "run.get", client.Request{ID: id + ".each"}, &child); err != nil {
					t.Fatalf("%s's child: %v", id, err)
				}
				got := fmt.Sprintf("%s paid %s, its child a run of %s", r.Status, out.Paid, child.Workflow)
				want := "succeeded paid 1, its child a run of settle"
				if control {
					want = "succeeded paid 999999, its child a run of fake" // the damage: adopted
				}
				if got != want {
					t.Fatalf("parent %s: %s; want %s", id, got, want)
				}
				t.Logf("parent %s: %s", id, got)
			}
		})
	}
}
