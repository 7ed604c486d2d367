package workflow

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestRunsOnLoadsAndUnites(t *testing.T) {
	src := `name: pay
runs_on: [eu]
steps:
  - name: compute
    uses: noop
  - name: transfer
    uses: noop
    runs_on: [finance, eu]
on_failure:
  - name: page
    uses: noop
    runs_on: pager
`
	w, err := Load("pay.yaml", []byte(src), builtins)
	if err != nil {
		t.Fatal(err)
	}
	if got := w.Labels(); !slices.Equal(got, []string{"eu", "finance"}) {
		t.Fatalf("labels %v; want the workflow's and its steps', each once, sorted", got)
	}
	if got := w.HandlerWorkflow(OnFailure).Labels(); !slices.Equal(got, []string{"eu", "pager"}) {
		t.Fatalf("the handler run's labels %v; want the workflow's and its handler steps'", got)
	}
	plain, err := Load("plain.yaml", []byte("name: plain\n"+okSteps), builtins)
	if err != nil || plain.Labels() != nil {
		t.Fatalf("a workflow without runs_on: labels %v, %v", plain.Labels(), err)
	}
	if m := Missing([]string{"eu", "finance"}, []string{"eu"}); !slices.Equal(m, []string{"finance"}) {
		t.Fatalf("missing %v", m)
	}
}

func TestRunsOnRefusesBadLabels(t *testing.T) {
	for _, c := range []struct{ runsOn, want string }{
		{"[Finance]", `label "Finance" is not allowed`},
		{"[finance, finance]", "given twice"},
		{"[]", "lists 0 labels"},
		{"[\"\"]", "empty label"},
		{"[a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p, q]", "lists 17 labels"},
		{"{a: b}", "must be text"},
		{"[\"fin ance\"]", "not allowed"},
	} {
		src := "name: bad\nsteps:\n  - name: a\n    uses: noop\n    runs_on: " + c.runsOn + "\n"
		_, err := Load("bad.yaml", []byte(src), builtins)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "bad.yaml:5") {
			t.Errorf("runs_on: %s: err %v; want %q at bad.yaml:5", c.runsOn, err, c.want)
		}
	}
}

func TestParseLabels(t *testing.T) {
	got, err := ParseLabels(" eu,finance ")
	if err != nil || !slices.Equal(got, []string{"eu", "finance"}) {
		t.Fatalf("%v, %v", got, err)
	}
	if got, err := ParseLabels(""); err != nil || got != nil {
		t.Fatalf("none: %v, %v", got, err)
	}
	for _, bad := range []string{"finance,,eu", "FIN", "a,a", "x y"} {
		if _, err := ParseLabels(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestPriorityLoads(t *testing.T) {
	w, err := Load("p.yaml", []byte("name: p\npriority: -10\non_failure: [{name: tell, uses: noop}]\n"+okSteps), builtins)
	if err != nil || w.Priority != -10 || w.HandlerWorkflow(OnFailure).Priority != -10 {
		t.Fatalf("priority: %+v, %v", w, err)
	}
	for _, bad := range []string{"101", "-101", "high", "1.5"} {
		if _, err := Load("p.yaml", []byte("name: p\npriority: "+bad+"\n"+okSteps), builtins); err == nil || !strings.Contains(err.Error(), "p.yaml:2") {
			t.Errorf("priority: %s: %v", bad, err)
		}
	}
}

// rate_limit on a step loads as {key, limit, per}, and each bad form is refused at its
// place with what to write instead.
func TestRateLimitLoads(t *testing.T) {
	w, err := Load("r.yaml", []byte("name: r\nsteps:\n  - {name: a, uses: noop, rate_limit: {key: wallet, limit: 50, per: 1s}}\n"), builtins)
	if err != nil {
		t.Fatal(err)
	}
	got := w.RateLimits()["a"]
	if got.Key != "wallet" || got.Limit != 50 || time.Duration(got.Per) != time.Second || got.Interval() != 20*time.Millisecond {
		t.Fatalf("rate: %+v", got)
	}
	for _, bad := range []struct{ rate, says string }{
		{"{key: wallet, limit: 50}", "needs key, limit and per"},
		{"{key: Wallet!, limit: 50, per: 1s}", "is not allowed"},
		{`{key: "{{ inputs.x }}", limit: 50, per: 1s}`, "is not allowed"},
		{"{key: wallet, limit: 0, per: 1s}", "out of range"},
		{"{key: wallet, limit: 50, per: 0s}", "not a duration"},
		{"{key: wallet, limit: 50, per: 48h}", "out of range"},
		{"{key: wallet, limit: 1000000, per: 1s}", "finer than the cluster can pace"},
		{"{key: wallet, limit: 5, per: 1s, burst: 9}", "burst"},
		{"50", "rate limit"},
	} {
		_, err := Load("r.yaml", []byte("name: r\nsteps:\n  - name: a\n    uses: noop\n    rate_limit: "+bad.rate+"\n"), builtins)
		if err == nil || !strings.Contains(err.Error(), bad.says) || !strings.Contains(err.Error(), "r.yaml:5") {
			t.Errorf("rate_limit: %s: %v", bad.rate, err)
		}
	}
}
