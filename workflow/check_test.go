package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/flowrun/flow/steps"
)

// loadChecked loads with the built-in kinds and their checks of with, as flowctl
// workflow validate does.
func loadChecked(data string) (*Workflow, error) {
	reg := steps.NewRegistry(0)
	return LoadWith("w.yaml", []byte(data), Options{Kinds: reg.Has, With: reg.CheckWith})
}

// A with its kind would refuse at run time is refused at load, at the value's
// line:column, naming the key.
func TestWithChecks(t *testing.T) {
	step := func(body string) string { return "name: x\nsteps:\n  - name: a\n" + body }
	cases := []struct {
		name, yaml string
		line, col  int
		want       string
	}{
		{"sleep soon", step("    uses: sleep\n    with:\n      duration: soon\n"), 6, 17, `with.duration: "soon" is not a duration`},
		{"sleep soon flow style", step("    uses: sleep\n    with: {duration: soon}\n"), 5, 22, `with.duration: "soon" is not a duration`},
		{"sleep number", step("    uses: sleep\n    with: {duration: 5}\n"), 5, 22, "with.duration: 5 is not a duration"},
		{"sleep without with", step("    uses: sleep\n"), 4, 11, "with.duration: is required"},
		{"exec empty command", step("    uses: exec\n    with:\n      command: []\n"), 6, 16, "with.command: must not be empty"},
		{"exec command text", step("    uses: exec\n    with:\n      command: \"ls\"\n"), 6, 16, `with.command: must be a list, not "ls"`},
		{"exec command element", step("    uses: exec\n    with:\n      command:\n        - echo\n        - hi: there\n"), 8, 11, "with.command[1]: must be text"},
		{"exec env list", step("    uses: exec\n    with:\n      command: [ls]\n      env: [A=b]\n"), 7, 12, "with.env: must be a mapping"},
		{"http bad method", step("    uses: http\n    with:\n      url: https://example.com\n      method: POTS\n"), 7, 15, `with.method: "POTS" is not an HTTP method`},
		{"http relative url", step("    uses: http\n    with:\n      url: example.com/credit\n"), 6, 12, "with.url: \"example.com/credit\" is not an absolute http or https URL"},
		{"http no url", step("    uses: http\n    with:\n      method: GET\n"), 6, 7, "with.url: is required"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := loadChecked(c.yaml)
			var es Errors
			if !errors.As(err, &es) || len(es) != 1 {
				t.Fatalf("err = %v; want one error", err)
			}
			if e := es[0]; e.Line != c.line || e.Col != c.col || !strings.Contains(e.Msg, c.want) || !strings.Contains(e.Msg, `step "a"`) {
				t.Fatalf("got %v; want %q at %d:%d", e, c.want, c.line, c.col)
			}
		})
	}
}

// Templates stand wherever a value does, and the contract's example passes.
func TestWithChecksAcceptTemplates(t *testing.T) {
	ok := `name: x
inputs:
  argv: {type: list, default: [ls]}
  wait: {type: string, default: 1s}
  url: {type: string, default: "http://127.0.0.1:9090"}
  verb: {type: string, default: POST}
steps:
  - name: a
    uses: exec
    with: {command: "{{ inputs.argv }}"}
  - name: b
    uses: exec
    with: {command: [echo, "{{ inputs.wait }}", 3], env: {A: "{{ inputs.url }}"}, dir: /tmp}
  - name: c
    uses: sleep
    with: {duration: "{{ inputs.wait }}"}
  - name: d
    uses: http
    with: {url: "{{ inputs.url }}/credit", method: "{{ inputs.verb }}"}
  - name: e
    uses: http
    with: {url: "http://127.0.0.1:9090/x", method: post, headers: {A: b}, body: {k: v}}
  - name: f
    uses: noop
    with: {anything: [1, {at: all}]}
`
	if _, err := loadChecked(ok); err != nil {
		t.Fatal(err)
	}
	if _, err := loadChecked(mustRead(t, "testdata/contract.yaml")); err != nil {
		t.Fatal(err)
	}
}

// A registered Go kind's checker is asked too (the engine passes its registry's), and
// a with error comes with the graph's errors, not instead of them.
func TestWithChecksRegisteredKind(t *testing.T) {
	reg := steps.NewRegistry(0)
	nop := steps.Func(func(context.Context, steps.Input) (json.RawMessage, error) { return nil, nil })
	if err := reg.Register("payout", steps.WithCheck(nop, func(with map[string]any) error {
		if _, ok := with["account"].(string); !ok {
			return &steps.WithError{Path: []string{"account"}, Msg: "is required", Hint: "the ledger account to pay from"}
		}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	if err := reg.Register("picky", steps.WithCheck(nop, func(map[string]any) error { return errors.New("never") })); err != nil {
		t.Fatal(err)
	}
	_, err := LoadWith("w.yaml", []byte("name: x\nsteps:\n  - name: a\n    uses: payout\n    with: {acount: x}\n    needs: [nope]\n  - name: b\n    uses: picky\n    with: {x: 1}\n"),
		Options{Kinds: reg.Has, With: reg.CheckWith})
	want := []string{
		`w.yaml:6:13: step "a" needs unknown step "nope" (steps: a, b)`,
		`w.yaml:5:11: step "a" (payout): with.account: is required (the ledger account to pay from)`,
		`w.yaml:9:11: step "b" (picky): with: never`,
	}
	if err == nil || err.Error() != strings.Join(want, "\n") {
		t.Fatalf("got:\n%v\nwant:\n%s", err, strings.Join(want, "\n"))
	}
}

// The cap on steps is an error at the steps key that names it; the cap itself loads.
func TestStepsCap(t *testing.T) {
	if _, err := Load("w.yaml", []byte(chain(MaxSteps, false)), builtins); err != nil {
		t.Fatalf("%d steps: %v", MaxSteps, err)
	}
	_, err := Load("w.yaml", []byte(chain(MaxSteps+1, false)), builtins)
	var es Errors
	if !errors.As(err, &es) || len(es) != 1 || es[0].Line != 2 || es[0].Col != 1 ||
		!strings.Contains(es[0].Msg, fmt.Sprintf("has %d steps; at most %d are allowed", MaxSteps+1, MaxSteps)) || !strings.Contains(es[0].Hint, "foreach") {
		t.Fatalf("err = %v", err)
	}
}

// Reads of steps reachable only through other steps are judged right, beyond 64
// distinct steps read (more than one word of the bitsets).
func TestReachability(t *testing.T) {
	var b strings.Builder
	b.WriteString("name: x\nsteps:\n  - name: s0\n    uses: noop\n  - name: side\n    uses: noop\n")
	for i := 1; i <= 150; i++ {
		fmt.Fprintf(&b, "  - name: s%d\n    uses: noop\n    needs: [s%d]\n    with: {a: \"{{ steps.s%d.output }}\"}\n", i, i-1, max(i-2, 0))
	}
	if _, err := Load("w.yaml", []byte(b.String()), builtins); err != nil {
		t.Fatal(err)
	}
	b.WriteString("  - name: last\n    uses: noop\n    needs: [s150]\n    with: {a: \"{{ steps.s3.output }}\", b: \"{{ steps.side.output }}\", c: \"{{ steps.last.output }}\"}\n")
	_, err := Load("w.yaml", []byte(b.String()), builtins)
	var es Errors
	if !errors.As(err, &es) || len(es) != 2 || !strings.Contains(es[0].Msg, `step "side" is not reachable`) || !strings.Contains(es[1].Msg, `step "last" is not reachable`) {
		t.Fatalf("err = %v", err)
	}
}

// Validation is linear: its graph passes do a bounded amount of work per step, counted
// rather than timed (20,000 chained steps took 74 s of CPU when it was quadratic).
func TestValidateLinear(t *testing.T) {
	per := map[int]int{}
	for _, n := range []int{1000, 8000} {
		l := &loader{file: "w.yaml", maxSteps: n}
		if _, err := l.load([]byte(chain(n, true)), Options{Kinds: builtins}); err != nil {
			t.Fatal(err)
		}
		per[n] = l.ops / n
		if l.ops > 10*n {
			t.Errorf("%d steps: %d operations; want at most %d", n, l.ops, 10*n)
		}
	}
	if per[8000] > per[1000]+1 {
		t.Errorf("operations per step grow with the steps: %v", per)
	}
}

// BenchmarkValidateChain loads a chain of n steps, each reading its predecessor's and
// the first step's output; 20,000 is beyond MaxSteps, lifted to measure the algorithm.
func BenchmarkValidateChain(b *testing.B) {
	for _, n := range []int{1000, 20000} {
		data := []byte(chain(n, true))
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				l := &loader{file: "w.yaml", maxSteps: n}
				if _, err := l.load(data, Options{Kinds: builtins}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// chain is a workflow of n steps, each needing the one before (and with templates,
// reading its output and the first step's).
func chain(n int, templates bool) string {
	var b strings.Builder
	b.WriteString("name: chain\nsteps:\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "  - name: s%d\n    uses: noop\n", i)
		if i > 0 {
			fmt.Fprintf(&b, "    needs: [s%d]\n", i-1)
			if templates {
				fmt.Fprintf(&b, "    with: {prev: \"{{ steps.s%d.output.v }}\", first: \"{{ steps.s0.output.v }}\"}\n", i-1)
			}
		}
	}
	return b.String()
}

func mustRead(t *testing.T, file string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// BenchmarkScopeChain is what a run of a MaxSteps chain spends naming the outputs each
// step's scope holds: every ancestor's (n(n-1)/2 names, as the engine did) or the ones
// its templates read (as it does).
func BenchmarkScopeChain(b *testing.B) {
	w, err := Load("w.yaml", []byte(chain(MaxSteps, true)), builtins)
	if err != nil {
		b.Fatal(err)
	}
	for name, names := range map[string]func(string) []string{"ancestors": w.Ancestors, "reads": w.Reads} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				for _, st := range w.Steps {
					names(st.Name)
				}
			}
		})
	}
}

// Reads is what a step's scope must hold: the steps its templates read, not every
// ancestor; the same for a workflow decoded from its JSON form.
func TestReads(t *testing.T) {
	w, err := Load("w.yaml", []byte(`name: x
steps:
  - name: a
    uses: noop
  - name: b
    uses: noop
    needs: [a]
  - name: c
    uses: noop
    needs: [b]
    foreach: "{{ steps.a.output.list }}"
    if: "{{ not steps.b.output.skip }}"
    with: {x: ["{{ steps.a.output.v }}", {y: "n={{ steps.b.output.n }}"}], z: plain, n: 1}
  - name: d
    uses: noop
    needs: [c]
`), builtins)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []*Workflow{w, d} {
		if got := fmt.Sprint(w.Reads("c"), w.Reads("d"), w.Reads("a"), w.Reads("nope")); got != "[a b] [] [] []" {
			t.Fatalf("reads = %s", got)
		}
	}
}
