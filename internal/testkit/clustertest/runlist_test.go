package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/app/cli"
	"github.com/flowrun/flow/internal/testkit/forge"
)

// run list over 10,000 runs created over three days, against a real flowd: the runs are
// written into its log as a writer of three days would have (each submit with its time,
// each cancelled at once so that none runs), beside real runs with a child and a handler
// run. `run list --since --until` followed page by page through its cursor (`--after`)
// gives every run of the range once, newest first by creation time; `--oldest` the
// other way; `--top-level` hides the child and the handler run, which a plain list shows.
func TestRunListOverThreeDays(t *testing.T) {
	t.Parallel() // no timing assertion: it runs beside the others (docs/testing.md, "How the suite is run")
	_, url, _ := embeddedFlowd(t)
	dir := t.TempDir()
	applyYAML(t, url, dir, "w", "name: w\nsteps:\n  - {name: a, uses: noop}\n")
	applyYAML(t, url, dir, "parent", "name: parent\nsteps:\n  - {name: kid, uses: workflow, with: {workflow: w}}\n")
	applyYAML(t, url, dir, "broken", "name: broken\non_failure: [{name: tell, uses: noop}]\nsteps:\n  - name: a\n    uses: exec\n    with: {command: [\"false\"]}\n")

	const runs = 10000
	start := time.Now().Add(-3 * 24 * time.Hour).Truncate(time.Second)
	step := 3 * 24 * time.Hour / runs
	at := func(i int) time.Time { return start.Add(time.Duration(i) * step) }
	w := forge.Open(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for first := 0; first < runs; first += 100 {
		var entries []checkpoint.Entry
		for i := first; i < first+100; i++ {
			id := fmt.Sprintf("old-%05d", i)
			entries = append(entries,
				checkpoint.Entry{Kind: checkpoint.KindSubmit, Run: id, At: at(i), Submit: &checkpoint.Submit{Workflow: "w", Version: 1,
					Trigger: checkpoint.TriggerManual, MaxEpochs: 3, Steps: []checkpoint.StepSpec{{Name: "a"}}}},
				checkpoint.Entry{Kind: checkpoint.KindCancel, Run: id, At: at(i), Reason: "forged"})
		}
		if _, err := w.Write(ctx, entries...); err != nil {
			t.Fatal(err)
		}
	}
	// The node applies the forged runs (200 entries a message) before anyone asks it
	// anything: a request waits at most 5 s for its node to catch up, which a busy
	// machine under -race can take longer than (the failure CI saw: "cannot catch up").
	applied := time.Now()
	WaitFor(t, 2*time.Minute, "the node to apply the forged runs", func() bool {
		return runOf(t, url, fmt.Sprintf("old-%05d", runs-1)).Status == "cancelled"
	})
	t.Logf("the node applied %d forged runs within %s of their last write", runs, time.Since(applied).Round(time.Millisecond))
	mustFlowctl(t, url, "run", "start", "parent", "--id", "p-1", "--wait")
	if code, out := flowctl(url, "run", "start", "broken", "--id", "b-1", "--wait"); code != 1 {
		t.Fatalf("the broken run: exit %d: %s", code, out)
	}
	WaitFor(t, 60*time.Second, "b-1's handler run", func() bool { return len(runOf(t, url, "b-1").Handlers) == 1 })

	list := func(args ...string) []string {
		t.Helper()
		var ids []string
		after := ""
		for pages := 0; ; pages++ {
			if pages > 100 {
				t.Fatalf("run list %v: more than 100 pages", args)
			}
			a := append([]string{"--server", url, "-o", "json", "run", "list", "--paged", "--limit", "997"}, args...)
			if after != "" {
				a = append(a, "--after", after)
			}
			var out, errOut strings.Builder
			if code := cli.Run(a, &out, &errOut, func(string) string { return "" }); code != 0 {
				t.Fatalf("flowctl %v: exit %d: %s", a, code, errOut.String())
			}
			var p client.RunPage
			if err := json.Unmarshal([]byte(out.String()), &p); err != nil {
				t.Fatalf("flowctl %v: %v: %q", a, err, out.String())
			}
			for _, r := range p.Runs {
				ids = append(ids, r.ID)
			}
			if p.Next == "" {
				return ids
			}
			after = p.Next
		}
	}
	// The second day: runs 3334 to 6666 of the forged ones, by their times.
	since, until := start.Add(24*time.Hour), start.Add(48*time.Hour)
	var want []string
	for i := range runs {
		if t := at(i); !t.Before(since) && t.Before(until) {
			want = append(want, fmt.Sprintf("old-%05d", i))
		}
	}
	slices.Reverse(want)
	got := list("--since", since.Format(time.RFC3339), "--until", until.Format(time.RFC3339))
	if !slices.Equal(got, want) {
		t.Fatalf("the second day, newest first: %d runs (first %v), want %d (first %v)", len(got), got[:min(3, len(got))], len(want), want[:3])
	}
	slices.Reverse(want)
	if got := list("--since", since.Format(time.RFC3339), "--until", until.Format(time.RFC3339), "--oldest"); !slices.Equal(got, want) {
		t.Fatalf("the second day, oldest first: %d runs, want %d", len(got), len(want))
	}
	all := list("--since", "1h")
	top := list("--since", "1h", "--top-level")
	slices.Sort(all)
	slices.Sort(top)
	handler := runOf(t, url, "b-1").Handlers[0]
	for _, id := range []string{"p-1", "b-1"} {
		if !slices.Contains(top, id) {
			t.Fatalf("--top-level misses %s: %v", id, top)
		}
	}
	for _, id := range []string{"p-1.kid", handler} {
		if !slices.Contains(all, id) || slices.Contains(top, id) {
			t.Fatalf("%s: in the plain list %v, in --top-level %v; want only the plain list", id, slices.Contains(all, id), slices.Contains(top, id))
		}
	}
	t.Logf("%d runs over three days: the second day's %d listed in %d-run pages; the last hour: %d runs, %d top-level", runs, len(want), 997, len(all), len(top))
}
