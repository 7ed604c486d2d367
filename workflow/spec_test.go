package workflow

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

var builtins = func(k string) bool { return k == "exec" || k == "http" || k == "sleep" || k == "noop" }

func TestContractExampleLoads(t *testing.T) {
	data, err := os.ReadFile("testdata/contract.yaml")
	if err != nil {
		t.Fatal(err)
	}
	w, err := Load("contract.yaml", data, builtins)
	if err != nil {
		t.Fatal(err)
	}
	if w.Name != "nightly-payout" || w.MaxEpochs != 5 || time.Duration(w.Timeout) != 2*time.Hour || len(w.Steps) != 3 {
		t.Fatalf("workflow = %+v", w)
	}
	if w.Schedule.Timezone != "Asia/Jakarta" || w.Schedule.Overlap != "skip" || w.Schedule.Catchup != "latest" {
		t.Fatalf("schedule = %+v", w.Schedule)
	}
	tr := w.Step("transfer")
	if tr.Foreach == "" || tr.Parallelism != 8 || tr.Needs[0] != "collect" || tr.With["method"] != "POST" {
		t.Fatalf("transfer = %+v", tr)
	}
	c := w.Step("collect")
	if c.Retry.MaxAttempts != 5 || time.Duration(c.Retry.MaxInterval) != time.Minute || time.Duration(c.Timeout) != 10*time.Minute {
		t.Fatalf("collect = %+v", c)
	}
	if w.Inputs[0].Name != "date" || !w.Inputs[0].HasDefault || w.Inputs[1].Default != false {
		t.Fatalf("inputs = %+v", w.Inputs)
	}
	if len(w.Digest) != 64 {
		t.Fatalf("digest %q", w.Digest)
	}
}

const okSteps = "steps:\n  - name: a\n    uses: noop\n"

// Each bad file must fail with its message at its line.
func TestBadWorkflows(t *testing.T) {
	cases := []struct {
		name, yaml string
		line       int
		want       string
	}{
		{"empty", "", 1, "the file is empty"},
		{"not yaml", "name: [x\n", 1, "not valid YAML"},
		{"tab indentation", "name: x\nsteps:\n\t- name: a\n", 3, "not valid YAML"},
		{"no name", okSteps, 1, "has no name"},
		{"no steps", "name: x\n", 1, "has no steps"},
		{"unknown top key", "name: x\nmax_epoch: 3\n" + okSteps, 2, `unknown key "max_epoch"`},
		{"bad name", "name: Nightly_Payout!\n" + okSteps, 1, "workflow name"},
		{"max_epochs text", "name: x\nmax_epochs: many\n" + okSteps, 2, "max_epochs must be a whole number"},
		{"max_epochs zero", "name: x\nmax_epochs: 0\n" + okSteps, 2, "out of range"},
		{"bad timeout", "name: x\ntimeout: 2 hours\n" + okSteps, 2, "is not a duration"},
		{"negative timeout", "name: x\ntimeout: -5m\n" + okSteps, 2, "is not a duration"},
		{"steps not list", "name: x\nsteps: {a: 1}\n", 2, "steps must be a non-empty list"},
		{"empty steps", "name: x\nsteps: []\n", 2, "steps must be a non-empty list"},
		{"step no name", "name: x\nsteps:\n  - uses: noop\n", 3, "a step has no name"},
		{"step no uses", "name: x\nsteps:\n  - name: a\n", 3, "has no `uses`"},
		{"unknown kind", "name: x\nsteps:\n  - name: a\n    uses: teleport\n", 4, `unknown kind "teleport"`},
		{"unknown step key", "name: x\nsteps:\n  - name: a\n    uses: noop\n    retries: 3\n", 5, `unknown key "retries"`},
		{"duplicate step", "name: x\nsteps:\n  - name: a\n    uses: noop\n  - name: a\n    uses: noop\n", 5, `step "a" is defined twice`},
		{"unknown need", "name: x\nsteps:\n  - name: a\n    uses: noop\n    needs: [b]\n", 5, `needs unknown step "b"`},
		{"self need", "name: x\nsteps:\n  - name: a\n    uses: noop\n    needs: [a]\n", 5, "needs itself"},
		{"cycle", "name: x\nsteps:\n  - name: a\n    uses: noop\n    needs: [b]\n  - name: b\n    uses: noop\n    needs: [a]\n", 3, "cycle: a -> b -> a"},
		{"bad cron", "name: x\nschedule:\n  cron: \"61 * * * *\"\n" + okSteps, 3, "bad cron"},
		{"cron zone prefix", "name: x\nschedule:\n  cron: \"CRON_TZ=UTC\"\n" + okSteps, 3, "bad cron"},
		{"never fires", "name: x\nschedule:\n  cron: \"0 0 30 2 *\"\n" + okSteps, 3, "never fires"},
		{"no cron", "name: x\nschedule:\n  timezone: UTC\n" + okSteps, 3, "needs a cron expression"},
		{"bad timezone", "name: x\nschedule:\n  cron: \"@daily\"\n  timezone: Mars/Olympus\n" + okSteps, 4, "unknown timezone"},
		{"bad overlap", "name: x\nschedule:\n  cron: \"@daily\"\n  overlap: sometimes\n" + okSteps, 4, "unknown overlap policy"},
		{"bad catchup", "name: x\nschedule:\n  cron: \"@daily\"\n  catchup: most\n" + okSteps, 4, "unknown catch-up policy"},
		{"bad input type", "name: x\ninputs:\n  n: {type: integer}\n" + okSteps, 3, `unknown type "integer"`},
		{"default wrong type", "name: x\ninputs:\n  n: {type: int, default: hello}\n" + okSteps, 3, "is not of type int"},
		{"unknown input key", "name: x\ninputs:\n  n: {type: int, required: true}\n" + okSteps, 3, `unknown key "required"`},
		{"bad step timeout", "name: x\nsteps:\n  - name: a\n    uses: noop\n    timeout: soon\n", 5, "is not a duration"},
		{"bad retry", "name: x\nsteps:\n  - name: a\n    uses: noop\n    retry: {max_attempts: 0}\n", 5, "out of range"},
		{"bad retry key", "name: x\nsteps:\n  - name: a\n    uses: noop\n    retry: {attempts: 3}\n", 5, `unknown key "attempts"`},
		{"bad parallelism", "name: x\nsteps:\n  - name: a\n    uses: noop\n    parallelism: -1\n", 5, "out of range"},
		{"unreachable step ref", "name: x\nsteps:\n  - name: a\n    uses: noop\n  - name: b\n    uses: noop\n    with: {x: \"{{ steps.a.output.v }}\"}\n", 7, `step "a" is not reachable through needs`},
		{"unknown input ref", "name: x\nsteps:\n  - name: a\n    uses: noop\n    with: {x: \"{{ inputs.date }}\"}\n", 5, "no such input"},
		{"item outside foreach", "name: x\nsteps:\n  - name: a\n    uses: noop\n    with: {x: \"{{ item.id }}\"}\n", 5, "item exists only"},
		{"unclosed template", "name: x\nsteps:\n  - name: a\n    uses: noop\n    with: {x: \"{{ inputs.a\"}\n", 5, "never closed"},
		{"bad template expr", "name: x\nsteps:\n  - name: a\n    uses: noop\n    if: \"{{ 1 + 2 }}\"\n", 5, "is not a path"},
		{"unknown template name", "name: x\nsteps:\n  - name: a\n    uses: noop\n    if: \"{{ tomorrow }}\"\n", 5, "unknown name"},
		{"with not mapping", "name: x\nsteps:\n  - name: a\n    uses: noop\n    with: [1, 2]\n", 5, "with must be a mapping"},
		{"duplicate key", "name: x\nname: y\n" + okSteps, 2, `has "name" twice`},
		{"concurrency key without limit", "name: x\nconcurrency: {key: a}\n" + okSteps, 2, "needs both key and limit"},
		{"concurrency key reads a step", "name: x\nconcurrency: {key: \"{{ steps.a.output }}\", limit: 1}\n" + okSteps, 2, "can read only inputs"},
		{"concurrency key unknown field", "name: x\nconcurrency: {key: a, limit: 1, per: 1s}\n" + okSteps, 2, `unknown key "per"`},
		{"concurrency limit zero", "name: x\nconcurrency: {key: a, limit: 0}\n" + okSteps, 2, "out of range"},
		{"concurrency key twice", "name: x\nconcurrency:\n  - {key: a, limit: 1}\n  - {key: a, limit: 2}\n" + okSteps, 4, "given twice"},
		{"concurrency key empty list", "name: x\nconcurrency: []\n" + okSteps, 2, "concurrency lists 0 keys"},
		{"step concurrency a number", "name: x\nsteps:\n  - name: a\n    uses: noop\n    concurrency: 2\n", 5, "a step's concurrency must not be \"2\""},
		{"step concurrency reads a step", "name: x\nsteps:\n  - name: a\n    uses: noop\n    concurrency: {key: \"{{ steps.a.output }}\", limit: 1}\n", 5, "can read only inputs"},
		{"step concurrency on a wait", "name: x\nsteps:\n  - name: a\n    uses: wait\n    with: {signal: go}\n    concurrency: {key: a, limit: 1}\n", 6, "holds nothing"},
		{"step concurrency the workflow's key", "name: x\nconcurrency: {key: a, limit: 1}\nsteps:\n  - name: a\n    uses: noop\n    concurrency: {key: a, limit: 1}\n", 6, "would wait for its own run"},
	}
	if len(cases) < 25 {
		t.Fatalf("only %d bad files", len(cases))
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Load("bad.yaml", []byte(c.yaml), builtins)
			var es Errors
			if !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("err = %v; want Errors", err)
			}
			found := false
			for _, e := range es {
				if strings.Contains(e.Msg, c.want) && e.Line == c.line && e.File == "bad.yaml" && e.Col >= 1 {
					found = true
				}
			}
			if !found {
				t.Fatalf("want %q at line %d, got:\n%v", c.want, c.line, err)
			}
			if !strings.HasPrefix(err.Error(), "bad.yaml:") {
				t.Fatalf("error does not start with file:line:col: %v", err)
			}
		})
	}
}

func TestTemplates(t *testing.T) {
	scope := map[string]any{
		"inputs": map[string]any{"date": "2026-11-28", "dry_run": false, "n": float64(3)},
		"steps":  map[string]any{"collect": map[string]any{"output": map[string]any{"drivers": []any{map[string]any{"id": "d1"}}}}},
		"item":   map[string]any{"id": "d1", "cents": float64(1250)},
		"run":    map[string]any{"id": "r1", "epoch": float64(42)},
	}
	for src, want := range map[string]any{
		"{{ inputs.date }}":                       "2026-11-28",
		"day={{inputs.date}} n={{ inputs.n }}":    "day=2026-11-28 n=3",
		"{{ item.cents }}":                        float64(1250),
		"{{ steps.collect.output.drivers.0.id }}": "d1",
		"{{ not inputs.dry_run }}":                true,
		"{{ inputs.date == \"2026-11-28\" }}":     true,
		"{{ run.epoch != 42 }}":                   false,
		"plain":                                   "plain",
	} {
		tmpl, err := ParseTemplate(src)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		got, err := tmpl.Render(scope)
		if err != nil || got != want {
			t.Errorf("%s = %#v (%v), want %#v", src, got, err, want)
		}
	}
	tmpl, _ := ParseTemplate("{{ steps.collect.output.drivers }}")
	if got, _ := tmpl.Render(scope); len(got.([]any)) != 1 {
		t.Fatalf("a whole-value template keeps the list: %#v", got)
	}
	tmpl, _ = ParseTemplate("{{ inputs.dtae }}")
	_, err := tmpl.Render(scope)
	var mk *MissingKeyError
	if !errors.As(err, &mk) || !strings.Contains(err.Error(), `inputs has no "dtae" (it has: date, dry_run, n)`) {
		t.Fatalf("missing key: %v", err)
	}
}

// FuzzLoad: the loader never panics; it is deterministic (the same bytes give the same
// workflow or the same errors, in the same order); every rejection is a list of clean
// errors that each point into the file; and what it accepts is whole: named after the
// file's bytes (digest), steps that exist and need only earlier-validated steps, and a
// form that survives its JSON round trip (how a run stores it).
func FuzzLoad(f *testing.F) {
	if data, err := os.ReadFile("testdata/contract.yaml"); err == nil {
		f.Add(data)
	}
	for _, seed := range []string{
		"name: x\n" + okSteps,
		"name: x\nsteps:\n  - name: a\n    uses: noop\n    if: \"{{ not inputs.x }}\"\n",
		"name: x\nschedule: {cron: \"*/5 * * * * *\"}\n" + okSteps,
		"name: x\nschedule: {cron: \"@daily\", timezone: Asia/Jakarta, overlap: queue, catchup: all}\n" + okSteps,
		"name: x\ninputs:\n  n: {type: int, default: 3}\n  l: {type: list, default: [1, 2]}\n  o: {type: object}\n" + okSteps,
		"name: x\nsteps:\n  - name: a\n    uses: exec\n    with: {command: [echo, \"{{ inputs.who }}\"]}\n",
		"name: x\nsteps:\n  - name: a\n    uses: noop\n  - name: b\n    needs: [a]\n    foreach: \"{{ steps.a.output.items }}\"\n    parallelism: 2\n    uses: noop\n    with: {v: \"{{ item }}\"}\n",
		"name: x\nsteps:\n  - name: a\n    needs: [b]\n    uses: noop\n  - name: b\n    needs: [a]\n    uses: noop\n", // a cycle
		"name: x\nsteps:\n  - name: a\n    uses: nope\n    timeout: soon\n    retry: {max_attempts: 0}\n",
		"name: x\nmax_epochs: 2\ntimeout: 1h\nconcurrency: 1\ndescription: d\n" + okSteps,
		"name: x\nsteps:\n  - name: a\n    uses: noop\n  - name: a\n    uses: noop\n",
		"name: x\nname: y\n" + okSteps,
		"name: x\nsteps:\n  - name: a\n    uses: noop\n    with: {x: \"{{ steps.zz.output }}\"}\n",
		"name: x\nsteps: {a: 1}\n",
		"- 1\n- 2\n",
		"name: x\nsteps:\n\t- name: a\n",
		"",
		"&a [*a]",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		w, err := Load("fuzz.yaml", data, builtins)
		w2, err2 := Load("fuzz.yaml", data, builtins)
		if (err == nil) != (err2 == nil) {
			t.Fatalf("loaded twice: %v, then %v", err, err2)
		}
		if err != nil {
			if err.Error() != err2.Error() {
				t.Fatalf("the same bytes, different errors:\n%v\nthen\n%v", err, err2)
			}
			var es Errors
			if !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("error of type %T: %v", err, err)
			}
			// Lines as YAML counts them: \r, \n (\r\n counted twice: a bound), NEL, LS, PS.
			lines := 1 + strings.Count(string(data), "\n") + strings.Count(string(data), "\r") +
				strings.Count(string(data), "\u0085") + strings.Count(string(data), "\u2028") + strings.Count(string(data), "\u2029")
			for _, e := range es {
				if e == nil || e.File != "fuzz.yaml" || e.Line < 1 || e.Line > lines+1 || e.Col < 1 || strings.TrimSpace(e.Msg) == "" {
					t.Fatalf("an error that does not point into the file (%d lines): %#v", lines, e)
				}
			}
			return
		}
		a, errA := json.Marshal(w)
		b, errB := json.Marshal(w2)
		if errA != nil || errB != nil || !bytes.Equal(a, b) {
			t.Fatalf("the same bytes, different workflows (%v %v):\n%s\n%s", errA, errB, a, b)
		}
		sum := sha256.Sum256(data)
		if w.Source != string(data) || w.Digest != hex.EncodeToString(sum[:]) || w.Name == "" || len(w.Steps) == 0 || len(w.Steps) > MaxSteps {
			t.Fatalf("accepted workflow: name %q, %d steps, digest %s; source kept: %v", w.Name, len(w.Steps), w.Digest, w.Source == string(data))
		}
		for _, st := range w.Steps {
			if w.Step(st.Name) != st || !builtins(st.Uses) {
				t.Fatalf("step %q (uses %q) is not the workflow's own or not of a known kind", st.Name, st.Uses)
			}
			for _, n := range st.Needs {
				if w.Step(n) == nil || n == st.Name || slices.Contains(w.Ancestors(n), st.Name) {
					t.Fatalf("step %q needs %q: unknown, itself, or in a cycle", st.Name, n)
				}
			}
		}
		d, err := Decode(a)
		if err != nil {
			t.Fatalf("the stored form does not decode: %v", err)
		}
		if c, _ := json.Marshal(d); !bytes.Equal(a, c) {
			t.Fatalf("the stored form changes in a round trip:\n%s\n%s", a, c)
		}
	})
}

func TestAncestors(t *testing.T) {
	w, err := Load("a.yaml", []byte("name: x\nsteps:\n  - name: a\n    uses: noop\n  - name: b\n    needs: [a]\n    uses: noop\n  - name: c\n    needs: [b]\n    uses: noop\n  - name: d\n    uses: noop\n"), builtins)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(w.Ancestors("c"), ","); got != "b,a" {
		t.Fatalf("ancestors of c = %q", got)
	}
	if len(w.Ancestors("d")) != 0 || len(w.Ancestors("nope")) != 0 {
		t.Fatal("d and unknown steps have no ancestors")
	}
}

// A bad `deadline:` is one error among the file's others, not a wall in front of them:
// the loader reports every problem of the file together (issue 38). It once stopped
// after the first pass, so the deadline hid the kind, need and template errors below it.
func TestBadDeadlineHidesNothing(t *testing.T) {
	yaml := "name: x\ndeadline: tomorrow\nsteps:\n" +
		"  - name: a\n    uses: teleport\n" +
		"  - name: b\n    uses: noop\n    timeout: soon\n" +
		"  - name: c\n    uses: noop\n    with: {x: \"{{ inputs.date }}\"}\n" +
		"on_failure:\n  - name: tell\n    uses: noop\n    needs: [gone]\n"
	_, err := Load("bad.yaml", []byte(yaml), builtins)
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("err = %v; want Errors", err)
	}
	for _, want := range []struct {
		line int
		msg  string
	}{
		{2, `deadline "tomorrow"`},
		{5, `unknown kind "teleport"`},
		{8, `"soon" is not a duration`},
		{11, "no such input"},
		{15, `needs unknown step "gone"`},
	} {
		found := false
		for _, e := range es {
			found = found || (e.Line == want.line && strings.Contains(e.Msg, want.msg))
		}
		if !found {
			t.Errorf("want %q at line %d among the errors, got:\n%v", want.msg, want.line, err)
		}
	}
	// Alone, the deadline's error is the only one, with its hint.
	_, err = Load("bad.yaml", []byte("name: x\ndeadline: tomorrow\n"+okSteps), builtins)
	if !errors.As(err, &es) || len(es) != 1 || es[0].Line != 2 || !strings.Contains(es[0].Hint, `"06:00"`) {
		t.Fatalf("a lone bad deadline: %v", err)
	}
}
