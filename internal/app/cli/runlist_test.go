package cli

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
)

// run list: newest first by creation time (not by ID), --oldest, a cursor printed when
// more match than --limit that goes on where the page ended, the bare array in JSON
// unless --after or --paged, filters by status (repeated), trigger, input and time, and
// bad flags refused with what to give (exit 2). run get: started_at and ended_at on the
// run and each step, deadline and handlers.
func TestRunListNewestFirstWithCursorAndFilters(t *testing.T) {
	e := startFlowd(t)
	e.flowctl("workflow", "apply", "-f", e.file("w.yaml", "name: w\ninputs:\n  day: {type: string, default: mon}\nsteps:\n  - name: a\n    uses: noop\n"))
	e.flowctl("workflow", "apply", "-f", e.file("f.yaml", "name: f\nsteps:\n  - name: a\n    uses: exec\n    with: {command: [\"false\"]}\n"))
	// IDs in the reverse of their creation order: a listing by ID would be the other way.
	ids := []string{"z5", "y4", "x3", "w2", "v1"}
	for i, id := range ids {
		wf, day := "w", "mon"
		if i%2 == 1 {
			wf, day = "f", ""
		}
		args := []string{"run", "start", wf, "--id", id, "--wait"}
		if day != "" && i == 4 {
			args = append(args, "--input", "day=tue")
		}
		if code, _, errOut := e.flowctl(args...); code > 1 {
			t.Fatalf("start %s: %d %s", id, code, errOut)
		}
	}
	list := func(args ...string) []string {
		t.Helper()
		code, out, errOut := e.flowctl(append([]string{"run", "list", "-o", "json"}, args...)...)
		var runs []client.Run
		if code != 0 || json.Unmarshal([]byte(out), &runs) != nil {
			t.Fatalf("run list %v: %d %q %q", args, code, out, errOut)
		}
		var got []string
		for _, r := range runs {
			got = append(got, r.ID)
		}
		return got
	}
	newest := slices.Clone(ids)
	slices.Reverse(newest)
	if got := list(); !slices.Equal(got, newest) {
		t.Fatalf("run list: %v, want newest first %v", got, newest)
	}
	if got := list("--oldest"); !slices.Equal(got, ids) {
		t.Fatalf("run list --oldest: %v, want %v", got, ids)
	}
	if got, want := list("--status", "failed"), []string{"w2", "y4"}; !slices.Equal(got, want) {
		t.Fatalf("--status failed: %v, want %v", got, want)
	}
	if got, want := list("--status", "failed", "--status", "succeeded", "--limit", "3"), newest[:3]; !slices.Equal(got, want) {
		t.Fatalf("two statuses, limit 3: %v, want %v", got, want)
	}
	if got, want := list("--input", "day=tue"), []string{"v1"}; !slices.Equal(got, want) {
		t.Fatalf("--input day=tue: %v, want %v", got, want)
	}
	if got := list("--trigger", "cron"); len(got) != 0 {
		t.Fatalf("--trigger cron: %v", got)
	}
	if got := list("--since", "1h", "--until", time.Now().Add(time.Hour).Format(time.RFC3339)); !slices.Equal(got, newest) {
		t.Fatalf("the last hour: %v", got)
	}
	if got := list("--until", "1h"); len(got) != 0 {
		t.Fatalf("before an hour ago: %v", got)
	}

	// Pages: the table ends with the cursor; the cursor goes on; the last page has none.
	code, out, _ := e.flowctl("run", "list", "--limit", "2")
	m := regexp.MustCompile(`(?m)^more: --after (\S+)$`).FindStringSubmatch(out)
	if code != 0 || m == nil || !strings.Contains(out, "CREATED UTC") || !strings.Contains(out, "v1") || strings.Contains(out, "x3") {
		t.Fatalf("run list --limit 2: %d %q", code, out)
	}
	var seen []string
	after := m[1]
	for range 5 {
		code, out, _ := e.flowctl("run", "list", "-o", "json", "--limit", "2", "--after", after)
		var page client.RunPage
		if code != 0 || json.Unmarshal([]byte(out), &page) != nil {
			t.Fatalf("--after: %d %q", code, out)
		}
		for _, r := range page.Runs {
			seen = append(seen, r.ID)
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	if want := newest[2:]; !slices.Equal(seen, want) {
		t.Fatalf("the pages after the first: %v, want %v", seen, want)
	}
	if code, out, _ := e.flowctl("run", "list", "-o", "json", "--paged", "--limit", "10"); code != 0 || !strings.HasPrefix(out, "{") || strings.Contains(out, `"next"`) {
		t.Fatalf("--paged, one page: %d %q", code, out)
	}

	for _, c := range []struct{ args, want string }{
		{"--since yesterday", "--since"},
		{"--until 2026-13-01", "--until"},
		{"--since 1h --until 2h", "not before"},
		{"--limit 0", "--limit"},
		{"--input day", "KEY=VALUE"},
		{"--parent v1 --top-level", "--parent"},
		{"--status done", "status \"done\""},
		{"--trigger timer", "trigger \"timer\""},
		{"--after zz", "cursor"},
	} {
		code, _, errOut := e.flowctl(append([]string{"run", "list"}, strings.Fields(c.args)...)...)
		if code != ExitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("run list %s: exit %d, %q (want exit %d naming %q)", c.args, code, errOut, ExitUsage, c.want)
		}
	}

	// run get: the run's and the steps' times, a deadline (none), handlers (none).
	code, out, _ = e.flowctl("run", "get", "v1", "-o", "json")
	var run map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &run) != nil {
		t.Fatalf("run get: %d %q", code, out)
	}
	started, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(run["started_at"]))
	ended, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(run["ended_at"]))
	if started.IsZero() || ended.Before(started) || run["deadline"] != nil || run["handlers"] == nil {
		t.Fatalf("run get's times, deadline, handlers: %v %v %v %v", run["started_at"], run["ended_at"], run["deadline"], run["handlers"])
	}
	st := run["steps"].([]any)[0].(map[string]any)
	stStarted, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(st["started_at"]))
	stEnded, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(st["ended_at"]))
	if stStarted.Before(started) || stEnded.Before(stStarted) || stEnded.After(ended) {
		t.Fatalf("step times %v..%v outside the run's %v..%v", st["started_at"], st["ended_at"], run["started_at"], run["ended_at"])
	}
}
