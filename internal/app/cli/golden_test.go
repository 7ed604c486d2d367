package cli

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flowrun/flow/client"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// The table forms, rendered from fixed data, against golden files (go test -update).
func TestTableGolden(t *testing.T) {
	at := func(s string) *string { return &s }
	run := client.Run{ID: "20261129-020000.000-abc123", Workflow: "nightly-payout", Version: 3, Status: "running",
		Trigger: "cron", ScheduledAt: "2026-11-29T02:00:00Z", Epoch: 1234, EpochChanges: 1, MaxEpochs: 5,
		CreatedAt: "2026-11-29T02:00:00Z", StartedAt: at("2026-11-29T02:00:01.25Z"),
		Deadline: &client.Deadline{At: "2026-11-29T06:00:00Z"}, Handlers: []string{"20261129-020000.000-abc123.on-failure.0"},
		Steps: []client.Step{
			{Name: "collect", Status: "succeeded", Attempts: 1, Epoch: 1200, StartedAt: at("2026-11-29T02:00:01.3Z"), EndedAt: at("2026-11-29T02:00:01.712Z")},
			{Name: "transfer", Status: "running", Attempts: 1, Epoch: 1234, Items: 1000, ItemsDone: 617, StartedAt: at("2026-11-29T02:00:01.75Z")},
			{Name: "report", Status: "pending"},
		},
		Epochs: []client.Epoch{{Epoch: 1200, Owner: "node-a", Reason: "assigned", At: "2026-11-29T02:00:01Z"},
			{Epoch: 1234, Owner: "node-b", Reason: "lease-expired", At: "2026-11-29T02:00:41Z"}},
		Fenced: []client.Fenced{{Step: "transfer", Item: 17, Epoch: 1200, CurrentEpoch: 1234, Owner: "node-a", Reason: "stale-epoch"}},
	}
	cases := map[string]func(io.Writer){
		"run-get": func(w io.Writer) { runTable(w, run) },
		"run-list": func(w io.Writer) {
			a := &app{out: w, output: "table"}
			_ = a.print([]client.Run{run}, func(w io.Writer) {
				listTable(w, []client.Run{run, {ID: "20261128-020000.000-zz9x8y", Workflow: "nightly-payout", Status: "succeeded", Epoch: 1100, CreatedAt: "2026-11-28T02:00:00Z"}})
			})
		},
	}
	until := "2026-11-30T02:00:00Z"
	waiting := client.Run{ID: "20261129-020000.000-def456", Workflow: "nightly-payout", Version: 3, Status: "waiting",
		Trigger: "manual", Epoch: 1240, MaxEpochs: 5, StartedBy: "otto", CreatedAt: "2026-11-29T02:00:00Z",
		StartedAt: at("2026-11-29T02:00:00.5Z"), EndedAt: at("2026-11-29T02:31:07.04Z"),
		Deadline:  &client.Deadline{At: "2026-11-29T02:30:00Z", Missed: true},
		Waiting:   &client.Waiting{Kind: "approval", Step: "approve", Until: &until, Need: 2, ApprovedBy: []string{"ann"}, Role: "operator"},
		Steps:     []client.Step{{Name: "ledger-closed", Status: "succeeded", Attempts: 1, Epoch: 1239}, {Name: "approve", Status: "pending"}},
		Epochs:    []client.Epoch{{Epoch: 1240, Owner: "node-a", Reason: "resumed", At: "2026-11-29T02:10:00Z"}},
		Inbox:     []client.Signal{{Seq: 12, Name: "ledger-closed", Sender: "otto", At: "2026-11-29T02:09:59.5Z", ConsumedBy: "ledger-closed"}},
		Decisions: []client.Decision{{Seq: 15, Step: "approve", Actor: "ann", Approve: true, Comment: "totals match", At: "2026-11-29T02:20:00Z"}},
	}
	cases["run-get-waiting"] = func(w io.Writer) { runTable(w, waiting) }
	cases["limits"] = func(w io.Writer) {
		limitsTable(w, client.Limits{Complete: true,
			Keys: []client.KeyUse{{Key: "payout-2026-11-29", Limit: 1, Holders: []string{"20261129-020000.000-abc123"}, Waiting: 1, Workflows: []string{"nightly-payout"}}},
			Rates: []client.RateUse{{Key: "wallet", Limit: 50, Per: "1s", Reserved: 12, Next: "2026-11-29T02:00:02.24Z", Workflows: []string{"nightly-payout"},
				Waiting: []client.RateWaiter{{Run: "20261129-020000.000-abc123", Step: "transfer", Item: 617, Node: "node-b", Since: "2026-11-29T02:00:02Z"}}}}})
	}
	cases["run-history"] = func(w io.Writer) {
		historyTable(w, []client.Event{
			{Seq: 2, Kind: "submit", Owner: "node-a", Actor: "otto", Outcome: "accepted"},
			{Seq: 3, Kind: "assign", Term: 57, Owner: "node-a", Outcome: "accepted"},
			{Seq: 4, Kind: "claim", Epoch: 3, Owner: "node-a", Outcome: "accepted"},
			{Seq: 9, Kind: "commit", Epoch: 3, Step: "transfer", Item: 17, Owner: "node-a", Outcome: "fenced: stale-epoch"},
			{Seq: 10, Kind: "park", Epoch: 3, Step: "approve", Owner: "node-a", Outcome: "accepted", Detail: "waits for approval"},
			{Seq: 11, Kind: "decide", Step: "approve", Owner: "node-b", Actor: "ann", Outcome: "accepted", Detail: "approve"},
		})
	}
	cases["cron-list"] = func(w io.Writer) {
		cronTable(w, []client.CronEntry{{Workflow: "nightly-payout", Cron: "0 2 * * *", Timezone: "Asia/Jakarta",
			Next: []string{"2026-11-30T02:00:00+07:00"}, Last: []client.Tick{{At: "2026-11-29T19:00:00Z", Outcome: "fired"}}}})
	}
	cases["cron-list-paused"] = func(w io.Writer) {
		cronTable(w, []client.CronEntry{{Workflow: "nightly-payout", Cron: "0 2 * * *", Timezone: "Asia/Jakarta",
			Next: []string{"2026-11-30T02:00:00+07:00"}, Last: []client.Tick{{At: "2026-11-29T19:00:00Z", Outcome: "paused"}},
			Paused: true, PausedReason: "incident 42: the bank's API is down", PausedBy: "olga", PausedSince: "2026-11-29T14:05:00Z"},
			{Workflow: "report", Cron: "0 6 * * *", Timezone: "UTC", Next: []string{"2026-11-30T06:00:00Z"}}})
	}
	cases["cron-next"] = func(w io.Writer) {
		nextTable(w, []client.NextTick{{Local: "2026-10-24T02:30:00+02:00", UTC: "2026-10-24T00:30:00Z"},
			{Local: "2026-10-25T02:30:00+01:00", UTC: "2026-10-25T01:30:00Z", DST: "daylight-saving day: UTC+02:00 to UTC+01:00; local times in the change are repeated (the clocks go back)"}})
	}
	cases["cron-backfill"] = func(w io.Writer) {
		backfillTable(w, []client.BackfillTick{{At: "2026-11-01T02:00:00+07:00", RunID: "nightly-payout-20261031T190000Z", Outcome: "ran"},
			{At: "2026-11-02T02:00:00+07:00", RunID: "nightly-payout-20261101T190000Z", Outcome: "backfilled"},
			{At: "2026-11-03T02:00:00+07:00", RunID: "nightly-payout-20261102T190000Z", Outcome: "backfilled"}})
	}
	cases["cluster-status"] = func(w io.Writer) {
		clusterTable(w, client.ClusterStatus{Leader: "node-b", Term: 57, FirstSeq: 8000, LastSeq: 9003, SnapshotSeq: 7999, Nodes: []client.Node{{ID: "node-a", Applied: 9001}, {ID: "node-b", Applied: 9001, Leader: true, Labels: []string{"eu", "finance"}}},
			ClusterVersion: 1, VersionNote: "node node-c reads log formats up to 1",
			Hold: &client.ClusterHold{By: "olga", Reason: "trying v2 on node-b", At: "2026-12-03T01:00:00Z"},
			Members: []client.ClusterMember{{ID: "node-a", Binary: "flowd 31c36d6aa1b2", Formats: []int{1, 2}, Live: true},
				{ID: "node-b", Binary: "flowd 31c36d6aa1b2", Formats: []int{1, 2}, Hold: true, Live: true}, {ID: "node-c", Formats: []int{1}, Inferred: true}}})
	}
	for name, render := range cases {
		var b bytes.Buffer
		a := &app{out: &b, output: "table"}
		if err := a.print(nil, render); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("testdata", name+".golden")
		if *update {
			if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test -update once)", err)
		}
		if !bytes.Equal(b.Bytes(), want) {
			t.Errorf("%s differs from %s:\n%s", name, path, b.String())
		}
		for _, l := range strings.Split(b.String(), "\n") {
			if len(l) > 80 {
				t.Errorf("%s: over 80 columns: %q", name, l)
			}
		}
	}
}
