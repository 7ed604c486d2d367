package cli

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/flowrun/flow/client"
)

// Acting on many runs: the dry run lists the selection and changes nothing; the bulk
// retry retries each failed run of the workflow once (not the other workflow's, not the
// succeeded), with the operation's name in each run's history; the bulk cancel ends the
// runs that had not; bad selections are refused (exit 2) and change nothing.
func TestBulkRetryAndCancel(t *testing.T) {
	e := startFlowd(t)
	e.flowctl("workflow", "apply", "-f", e.file("f.yaml", "name: f\nsteps:\n  - name: a\n    uses: exec\n    with: {command: [\"false\"]}\n"))
	e.flowctl("workflow", "apply", "-f", e.file("g.yaml", "name: g\nsteps:\n  - name: a\n    uses: exec\n    with: {command: [\"false\"]}\n"))
	e.flowctl("workflow", "apply", "-f", e.file("w.yaml", "name: w\nsteps:\n  - {name: w, uses: wait, with: {signal: go, timeout: 1h}}\n"))
	for i := range 5 {
		e.flowctl("run", "start", "f", "--id", fmt.Sprintf("f-%d", i), "--wait")
	}
	e.flowctl("run", "start", "g", "--id", "g-0", "--wait")
	for i := range 3 {
		e.flowctl("run", "start", "w", "--id", fmt.Sprintf("w-%d", i))
	}
	for i := range 3 {
		e.waitFor(fmt.Sprintf("w-%d", i), func(r client.Run) bool { return r.Status == "waiting" })
	}
	retries := func(id string) (n int, detail string) {
		t.Helper()
		code, out, _ := e.flowctl("run", "history", id, "-o", "json")
		var evs []client.Event
		if code != 0 || json.Unmarshal([]byte(out), &evs) != nil {
			t.Fatalf("history %s: %d %q", id, code, out)
		}
		for _, ev := range evs {
			if ev.Kind == "retry" && ev.Outcome == "accepted" {
				n++
				detail = ev.Detail
			}
		}
		return n, detail
	}

	applied := e.d.Engine().Applied()
	code, out, errOut0 := e.flowctl("run", "retry", "--workflow", "f", "--dry-run", "-o", "json")
	var dry BulkResult
	if code != 0 || json.Unmarshal([]byte(out), &dry) != nil || len(dry.Runs) != 5 || dry.Runs[0].Outcome != "would-retry" || !dry.DryRun {
		t.Fatalf("the dry run: %d %q %q", code, out, errOut0)
	}
	if e.d.Engine().Applied() != applied {
		t.Fatalf("the dry run wrote to the log")
	}

	code, out, errOut := e.flowctl("run", "retry", "--workflow", "f", "--max-parallel", "2")
	if code != 0 || !strings.Contains(out, "retried 5") || !strings.Contains(out, "operation bulk-retry-") {
		t.Fatalf("the bulk retry: %d %q %q", code, out, errOut)
	}
	op := strings.TrimSuffix(strings.Fields(out)[1], ":")
	for i := range 5 {
		id := fmt.Sprintf("f-%d", i)
		if n, detail := retries(id); n != 1 || !strings.Contains(detail, op) {
			t.Fatalf("%s: %d retries, the last saying %q; want one, naming %s", id, n, detail, op)
		}
	}
	if n, _ := retries("g-0"); n != 0 {
		t.Fatalf("g-0, another workflow's, was retried")
	}

	code, out, _ = e.flowctl("run", "cancel", "--workflow", "w", "-o", "json")
	var cancelled BulkResult
	if code != 0 || json.Unmarshal([]byte(out), &cancelled) != nil || len(cancelled.Runs) != 3 {
		t.Fatalf("the bulk cancel: %d %q", code, out)
	}
	for i := range 3 {
		r := e.waitFor(fmt.Sprintf("w-%d", i), client.Run.Terminal)
		if r.Status != "cancelled" || !strings.Contains(r.Error, cancelled.Operation) {
			t.Fatalf("w-%d: %s %q; want cancelled by %s", i, r.Status, r.Error, cancelled.Operation)
		}
	}

	// The retried runs fail again on their own: the log is still until they have.
	for i := range 5 {
		e.waitFor(fmt.Sprintf("f-%d", i), client.Run.Terminal)
	}
	applied = e.d.Engine().Applied()
	for _, c := range []struct{ args, want string }{
		{"run retry", "--workflow"},
		{"run cancel", "--workflow"},
		{"run retry f-0 --workflow f", "not both"},
		{"run retry --workflow f --from a", "need RUN"},
		{"run cancel --workflow w --max-parallel 0", "--max-parallel"},
		{"run retry --workflow f --since yesterday", "--since"},
	} {
		code, _, errOut := e.flowctl(strings.Fields(c.args)...)
		if code != ExitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: exit %d, %q; want exit %d naming %q", c.args, code, errOut, ExitUsage, c.want)
		}
	}
	if e.d.Engine().Applied() != applied {
		t.Fatalf("a refused bulk command wrote to the log")
	}
}
