package cli

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/app/daemon"
)

// startAuthFlowd starts a flowd with --auth: olga (operator) and vera (viewer).
func startAuthFlowd(t *testing.T) *env {
	dir := t.TempDir()
	users := filepath.Join(dir, "users.yaml")
	if err := os.WriteFile(users, []byte("users:\n  - {user: olga, password: o-secret-1, role: operator}\n  - {user: vera, password: v-secret-1, role: viewer}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--data-dir", filepath.Join(dir, "data"), "--nats-listen", "127.0.0.1:0", "--http", "off",
		"--node-id", "node-a", "--lease-ttl", "1s", "--auth", users}
	if os.Geteuid() == 0 {
		// Its steps write the test's files (t.TempDir: root's, 0700), so they run as
		// root, the one way back (issue 36); as a plain user they are flowd's own.
		args = append(args, "--exec-user", "root")
	}
	cfg, err := daemon.Load(args, []string{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := daemon.Start(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return &env{t: t, server: d.Engine().ClientURL(), dir: dir, d: d}
}

// as runs flowctl as a user of startAuthFlowd's.
func (e *env) as(user string, args ...string) (int, string, string) {
	return e.flowctl(append([]string{"--user", user, "--password", user[:1] + "-secret-1"}, args...)...)
}

const nightlyYAML = "name: nightly\nschedule:\n  cron: \"30 2 * * *\"\n  timezone: Europe/Amsterdam\nsteps:\n  - {name: a, uses: noop}\n"

// cron pause shows in cron list (table and JSON) with the reason and the person who
// paused; a viewer may not pause; resuming a schedule that runs exits 1; cron next
// prints -n rows in the schedule's timezone and UTC.
func TestCronPauseResumeNext(t *testing.T) {
	e := startAuthFlowd(t)
	if code, _, errOut := e.as("olga", "workflow", "apply", "-f", e.file("nightly.yaml", nightlyYAML)); code != 0 {
		t.Fatalf("apply: %d %s", code, errOut)
	}
	if code, _, errOut := e.as("vera", "cron", "pause", "nightly"); code != ExitNotAuthorized {
		t.Fatalf("a viewer's pause: %d %q; want exit 4", code, errOut)
	}
	code, out, errOut := e.as("olga", "cron", "pause", "nightly", "--reason", "incident 42")
	if code != 0 || out != "nightly paused: incident 42\n" {
		t.Fatalf("pause: %d %q %q", code, out, errOut)
	}
	code, out, _ = e.as("vera", "cron", "list")
	if code != 0 || !strings.Contains(out, "paused") || !strings.Contains(out, "nightly is paused by olga since ") || !strings.Contains(out, "reason: incident 42") {
		t.Fatalf("cron list:\n%s", out)
	}
	code, out, _ = e.as("vera", "cron", "list", "-o", "json")
	var cs []map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &cs) != nil || len(cs) != 1 {
		t.Fatalf("cron list -o json: %d %s", code, out)
	}
	if c := cs[0]; c["paused"] != true || c["paused_reason"] != "incident 42" || c["paused_by"] != "olga" || c["paused_since"] == nil {
		t.Fatalf("cron list -o json: %v", c)
	}

	if code, out, errOut = e.as("olga", "cron", "resume", "nightly"); code != 0 || out != "nightly resumed\n" {
		t.Fatalf("resume: %d %q %q", code, out, errOut)
	}
	if code, _, errOut = e.as("olga", "cron", "resume", "nightly"); code != ExitFailed || !strings.Contains(errOut, "not paused") {
		t.Fatalf("resuming a running schedule: %d %q; want exit 1 saying it is not paused", code, errOut)
	}
	code, out, _ = e.as("vera", "cron", "list", "-o", "json")
	cs = nil
	if json.Unmarshal([]byte(out), &cs) != nil || cs[0]["paused"] != false || cs[0]["paused_reason"] != nil {
		t.Fatalf("cron list after the resume: %d %s", code, out)
	}

	code, out, errOut = e.as("vera", "cron", "next", "nightly", "-n", "3")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 4 || !strings.HasPrefix(lines[0], "LOCAL") {
		t.Fatalf("cron next -n 3: %d %q %q", code, out, errOut)
	}
	for _, l := range lines[1:] {
		if !strings.Contains(l, " 02:30:00 +0") || !strings.Contains(l, "Z") {
			t.Fatalf("cron next row %q: want 02:30 local and UTC", l)
		}
	}
	code, out, _ = e.as("vera", "cron", "next", "nightly", "-o", "json")
	var next []client.NextTick
	if code != 0 || json.Unmarshal([]byte(out), &next) != nil || len(next) != 5 {
		t.Fatalf("cron next (default 5) -o json: %d %s", code, out)
	}
	if code, _, _ = e.as("vera", "cron", "next", "nightly", "-n", "0"); code != ExitUsage {
		t.Fatalf("cron next -n 0: %d", code)
	}
	if code, _, _ = e.as("vera", "cron", "next", "nope"); code != ExitUsage {
		t.Fatalf("cron next of an unknown workflow: %d; want 2 (not found)", code)
	}
}

// cron backfill: a dry run lists and starts nothing; the backfill runs each tick (trigger
// backfill, the tick's run ID); a second one of the same range reports ran and starts
// nothing; --max-parallel 1 starts a run only once the one before it ended; a bad TIME
// exits 2 naming its flag.
func TestCronBackfill(t *testing.T) {
	e := startFlowd(t)
	if code, _, errOut := e.flowctl("workflow", "apply", "-f", e.file("nightly.yaml", nightlyYAML)); code != 0 {
		t.Fatalf("apply: %d %s", code, errOut)
	}
	ams, _ := time.LoadLocation("Europe/Amsterdam")
	day := time.Now().In(ams).AddDate(0, 0, -4)
	from, to := day.Format(time.DateOnly), day.AddDate(0, 0, 3).Format(time.DateOnly) // the ticks of days -4, -3 and -2
	api := e.d.Engine().API()
	runs := func() []client.Run {
		rs, err := api.Runs(client.ListOptions{Workflow: "nightly", Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		return rs.Runs
	}

	for _, c := range []struct{ flag, args string }{{"--from", "--from yesterday --to " + to}, {"--to", "--from " + from + " --to 2026-13-01"}, {"--to", "--from " + from},
		{"--order", "--from " + from + " --to " + to + " --order sideways"}, {"--max-parallel", "--from " + from + " --to " + to + " --max-parallel -1"}} {
		code, _, errOut := e.flowctl(append([]string{"cron", "backfill", "nightly"}, strings.Fields(c.args)...)...)
		if code != ExitUsage || !strings.Contains(errOut, c.flag) {
			t.Errorf("backfill %s: %d %q; want exit 2 naming %s", c.args, code, errOut, c.flag)
		}
	}

	code, out, errOut := e.flowctl("cron", "backfill", "nightly", "--from", from, "--to", to, "--dry-run", "-o", "json")
	var dry []client.BackfillTick
	if code != 0 || json.Unmarshal([]byte(out), &dry) != nil || len(dry) != 3 {
		t.Fatalf("dry run: %d %q %q", code, out, errOut)
	}
	for _, d := range dry {
		if d.Outcome != "would-run" || !strings.HasPrefix(d.RunID, "nightly-") || !strings.Contains(d.At, "T02:30:00+0") {
			t.Fatalf("dry run: %+v", dry)
		}
	}
	if rs := runs(); len(rs) != 0 {
		t.Fatalf("the dry run started %d runs", len(rs))
	}

	code, out, errOut = e.flowctl("cron", "backfill", "nightly", "--from", from, "--to", to)
	if code != 0 || strings.Count(out, " backfilled ") != 3 || !strings.Contains(out, "3 backfilled") {
		t.Fatalf("backfill: %d\n%s%s", code, out, errOut)
	}
	for _, d := range dry {
		if !strings.Contains(out, d.RunID) {
			t.Fatalf("backfill does not print %s:\n%s", d.RunID, out)
		}
		r := e.waitFor(d.RunID, client.Run.Terminal)
		if r.Trigger != "backfill" || r.Status != "succeeded" {
			t.Fatalf("run %s: trigger %s, %s", r.ID, r.Trigger, r.Status)
		}
	}
	code, out, _ = e.flowctl("cron", "backfill", "nightly", "--from", from, "--to", to, "-o", "json")
	var again []client.BackfillTick
	if code != 0 || json.Unmarshal([]byte(out), &again) != nil || len(again) != 3 {
		t.Fatalf("second backfill: %d %s", code, out)
	}
	for i, a := range again {
		if a.Outcome != "ran" || a.RunID != dry[i].RunID {
			t.Fatalf("second backfill: %+v; want each tick ran with its run", again)
		}
	}
	if rs := runs(); len(rs) != 3 {
		t.Fatalf("%d runs after the second backfill; want 3", len(rs))
	}

	// Days -7 to -2, newest first, one at a time: days -5, -6 and -7 run, each once the
	// one before it ended; the three that ran are left as they were.
	wide := day.AddDate(0, 0, -3).Format(time.DateOnly)
	code, out, errOut = e.flowctl("cron", "backfill", "nightly", "--from", wide, "--to", to, "--max-parallel", "1", "--order", "newest", "-o", "json")
	var chunked []client.BackfillTick
	if code != 0 || json.Unmarshal([]byte(out), &chunked) != nil || len(chunked) != 6 {
		t.Fatalf("--max-parallel 1: %d %q %q", code, out, errOut)
	}
	var started []client.Run
	for i, c := range chunked {
		want := "ran"
		if i >= 3 {
			want = "backfilled"
		}
		if c.Outcome != want {
			t.Fatalf("--max-parallel 1: %+v", chunked)
		}
		if want == "backfilled" {
			r, err := api.Run(c.RunID)
			if err != nil || !r.Terminal() { // flowctl waited for it
				t.Fatalf("run %s when flowctl returned: %+v %v", c.RunID, r.Status, err)
			}
			started = append(started, r)
		}
	}
	// In the log, each run's submit comes after the last entry of the run before it.
	for i := 1; i < len(started); i++ {
		prev, err1 := api.History(started[i-1].ID)
		cur, err2 := api.History(started[i].ID)
		if err1 != nil || err2 != nil || len(prev) == 0 || len(cur) == 0 {
			t.Fatalf("histories: %v %v", err1, err2)
		}
		if cur[0].Seq < prev[len(prev)-1].Seq {
			t.Fatalf("run %s was submitted at seq %d, before %s ended at seq %d", started[i].ID, cur[0].Seq, started[i-1].ID, prev[len(prev)-1].Seq)
		}
	}
	if rs := runs(); len(rs) != 6 {
		t.Fatalf("%d runs; want 6", len(rs))
	}
}

// run retry --from STEP --input day=x runs the step and its dependents again with the
// input changed, and not the steps before it; --input without --from exits 2.
func TestRetryFromStep(t *testing.T) {
	e := startFlowd(t)
	log := filepath.Join(e.dir, "side-effects.txt")
	step := func(name, needs, extra string) string {
		s := "  - name: " + name + "\n    uses: exec\n    retry: {max_attempts: 1}\n    with: {command: [sh, -c, 'echo " + name + "-{{ inputs.day }} >> " + log + extra + "']}\n"
		if needs != "" {
			s += "    needs: [" + needs + "]\n"
		}
		return s
	}
	wf := "name: chain\ninputs:\n  day: {type: string}\nsteps:\n" + step("a", "", "") + step("b", "a", "") + step("c", "b", "") +
		step("d", "c", `; test {{ inputs.day }} = x`)
	if code, _, errOut := e.flowctl("workflow", "apply", "-f", e.file("chain.yaml", wf)); code != 0 {
		t.Fatalf("apply: %d %s", code, errOut)
	}
	if code, _, errOut := e.flowctl("run", "start", "chain", "--id", "c-1", "--input", "day=y", "--wait"); code != ExitFailed {
		t.Fatalf("the first run: %d %s; want it to fail at d", code, errOut)
	}
	if code, _, errOut := e.flowctl("run", "retry", "c-1", "--input", "day=x"); code != ExitUsage || !strings.Contains(errOut, "--from") {
		t.Fatalf("--input without --from: %d %q; want exit 2 naming --from", code, errOut)
	}
	if code, _, errOut := e.flowctl("run", "retry", "c-1", "--from", "nope"); code != ExitUsage || !strings.Contains(errOut, "no step \"nope\"") {
		t.Fatalf("--from an unknown step: %d %q; want exit 2", code, errOut)
	}
	code, out, errOut := e.flowctl("run", "retry", "c-1", "--from", "c", "--input", "day=x")
	if code != 0 || out != "c-1 pending (from step c)\n" {
		t.Fatalf("retry --from c: %d %q %q", code, out, errOut)
	}
	r := e.waitFor("c-1", client.Run.Terminal)
	if r.Status != "succeeded" {
		t.Fatalf("after the retry: %s (%s)", r.Status, r.Error)
	}
	got, _ := os.ReadFile(log)
	want := []string{"a-y", "b-y", "c-y", "d-y", "c-x", "d-x"}
	if lines := strings.Fields(string(got)); !slices.Equal(lines, want) {
		t.Fatalf("side effects %v; want %v (a and b once, c and d again with day=x)", lines, want)
	}
	if !strings.Contains(string(r.Inputs), `"day":"x"`) {
		t.Fatalf("the run's inputs: %s", r.Inputs)
	}

	// A run that has not ended is not retried.
	gate := e.file("gate.yaml", "name: gate\nsteps:\n  - {name: w, uses: wait, with: {signal: go, timeout: 1h}}\n")
	if code, _, errOut := e.flowctl("workflow", "apply", "-f", gate); code != 0 {
		t.Fatalf("apply: %d %s", code, errOut)
	}
	if code, _, errOut := e.flowctl("run", "start", "gate", "--id", "gate-1"); code != 0 {
		t.Fatalf("start: %d %s", code, errOut)
	}
	e.waitFor("gate-1", func(r client.Run) bool { return r.Status == "waiting" })
	if code, _, errOut := e.flowctl("run", "retry", "gate-1", "--from", "w"); code != ExitFailed {
		t.Fatalf("retrying a waiting run: %d %q; want exit 1", code, errOut)
	}
}
