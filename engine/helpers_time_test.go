package engine

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/flowrun/flow/workflow"
)

// The template helpers {{ yesterday }}, {{ today }} and {{ now }} in input defaults are
// rendered at a given instant (the submission, or the cron tick), in the schedule's
// timezone (UTC without a schedule): docs/workflow-spec.md, "Inputs". The instants here
// are pinned, so nothing depends on the day the test runs.
//
// (The helpers are names in package workflow; they are given their values here, in
// ResolveInputs, which is why this test is in engine.)
func TestHelpersAtAPinnedInstant(t *testing.T) {
	load := func(src string) *workflow.Workflow {
		t.Helper()
		w, err := workflow.Load("h.yaml", []byte(src), nil)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	const inputs = "inputs:\n  y: {type: string, default: \"{{ yesterday }}\"}\n  d: {type: string, default: \"{{ today }}\"}\n" +
		"  n: {type: string, default: \"{{ now }}\"}\n  f: {type: string, default: \"report-{{ yesterday }}.csv\"}\n"
	const steps = "steps:\n  - name: a\n    uses: noop\n"
	utc := load("name: h\n" + inputs + steps)
	jkt := load("name: h\nschedule:\n  cron: \"0 2 * * *\"\n  timezone: Asia/Jakarta\n" + inputs + steps)
	for _, c := range []struct {
		name       string
		w          *workflow.Workflow
		at         time.Time
		y, d, n, f string
	}{
		// 18:30 UTC on the 28th is 01:30 on the 29th in Jakarta (UTC+7).
		{"utc", utc, time.Date(2026, 11, 28, 18, 30, 0, 0, time.UTC), "2026-11-27", "2026-11-28", "2026-11-28T18:30:00Z", "report-2026-11-27.csv"},
		{"jakarta", jkt, time.Date(2026, 11, 28, 18, 30, 0, 0, time.UTC), "2026-11-28", "2026-11-29", "2026-11-29T01:30:00+07:00", "report-2026-11-28.csv"},
		// The instant's own zone does not matter, only the schedule's.
		{"jakarta from another zone", jkt, time.Date(2026, 11, 28, 13, 30, 0, 0, time.FixedZone("X", -5*3600)), "2026-11-28", "2026-11-29", "2026-11-29T01:30:00+07:00", "report-2026-11-28.csv"},
		// Month, year and leap-day boundaries.
		{"new year", utc, time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), "2026-12-31", "2027-01-01", "2027-01-01T00:00:00Z", "report-2026-12-31.csv"},
		{"leap day", utc, time.Date(2028, 3, 1, 12, 0, 0, 0, time.UTC), "2028-02-29", "2028-03-01", "2028-03-01T12:00:00Z", "report-2028-02-29.csv"},
		{"jakarta new year", jkt, time.Date(2026, 12, 31, 17, 0, 0, 0, time.UTC), "2026-12-31", "2027-01-01", "2027-01-01T00:00:00+07:00", "report-2026-12-31.csv"},
	} {
		got, err := ResolveInputs(c.w, nil, c.at)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		want := map[string]any{"y": c.y, "d": c.d, "n": c.n, "f": c.f}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s at %s: input %s = %v; want %v", c.name, c.at, k, got[k], v)
			}
		}
	}
	// A given input is taken as given, not replaced by its default.
	got, err := ResolveInputs(utc, map[string]any{"y": "2020-01-01"}, time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC))
	if err != nil || got["y"] != "2020-01-01" || got["d"] != "2026-11-28" {
		t.Fatalf("given input: %v %v", got, err)
	}
}

// A manual run's defaults are rendered at the engine's clock (Config.Now), once, when
// the run is submitted, and stored with the run.
func TestManualRunRendersHelpersAtTheEnginesClock(t *testing.T) {
	at := time.Date(2026, 2, 28, 23, 59, 59, 0, time.UTC)
	e := startEngine(t, func(c *Config) { c.Now = func() time.Time { return at } })
	apply(t, e, "name: h\ninputs:\n  y: {type: string, default: \"{{ yesterday }}\"}\n  d: {type: string, default: \"{{ today }}\"}\n"+
		"steps:\n  - name: a\n    uses: noop\n    with: {y: \"{{ inputs.y }}\", d: \"{{ inputs.d }}\"}\n")
	v := runToEnd(t, e, "h", nil)
	var in map[string]string
	if err := json.Unmarshal(v.Run.Inputs, &in); err != nil {
		t.Fatal(err)
	}
	if in["y"] != "2026-02-27" || in["d"] != "2026-02-28" {
		t.Fatalf("stored inputs %v; want yesterday 2026-02-27 and today 2026-02-28", in)
	}
	var out map[string]string
	if err := json.Unmarshal(v.Steps[0].Output, &out); err != nil || out["y"] != "2026-02-27" || out["d"] != "2026-02-28" {
		t.Fatalf("step output %s (%v)", v.Steps[0].Output, err)
	}
}
