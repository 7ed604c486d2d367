package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flowrun/flow/internal/app/daemon"
)

// Run IDs that are no valid KV key or subject token ("a.", "a..b", ".a") are refused at
// the door with exit 2 and nothing written: such a run once stayed pending forever, its
// task redelivered without pause. Errors name the thing, not the package.
func TestIDsAndNotFoundAtTheDoor(t *testing.T) {
	e := startFlowd(t)
	wf := e.file("hello.yaml", "name: hello\nsteps:\n  - name: a\n    uses: noop\n")
	if code, _, errOut := e.flowctl("workflow", "apply", "-f", wf); code != 0 {
		t.Fatalf("apply: %d %s", code, errOut)
	}
	applied := e.d.Engine().Applied()
	for _, id := range []string{"a.", "a..b", ".a", "a b", "a:b", "a*", strings.Repeat("x", 129)} {
		code, _, errOut := e.flowctl("run", "start", "hello", "--id", id)
		if code != 2 || !strings.Contains(errOut, "two in a row") {
			t.Errorf("run start --id %q: exit %d %q, want 2 and the ID rule", id, code, errOut)
		}
		if code, _, _ := e.flowctl("run", "get", id); code != 2 {
			t.Errorf("run get %q: exit %d, want 2", id, code)
		}
	}
	if got := e.d.Engine().Applied(); got != applied {
		t.Fatalf("refused IDs wrote to the log: applied %d -> %d", applied, got)
	}
	if code, out, errOut := e.flowctl("run", "start", "hello", "--id", "a-b_C9", "--wait"); code != 0 {
		t.Fatalf("a valid ID: %d %s %s", code, out, errOut)
	}
	// IDs with '.' and those of scheduled ticks are flow's own (a child's, a handler's, a
	// tick's: issue 36): refused, naming why, and nothing is written.
	applied = e.d.Engine().Applied()
	for id, why := range map[string]string{"a.b-c_d": "IDs with '.' are kept for the runs flow derives", "hello-20261204T000000Z": "kept for the runs of scheduled ticks"} {
		if code, _, errOut := e.flowctl("run", "start", "hello", "--id", id); code != 2 || !strings.Contains(errOut, why) || strings.Contains(errOut, "engine:") {
			t.Errorf("run start --id %q: exit %d %q, want 2 and %q", id, code, errOut, why)
		}
	}
	if got := e.d.Engine().Applied(); got != applied {
		t.Fatalf("refused reserved IDs wrote to the log: applied %d -> %d", applied, got)
	}
	code, _, errOut := e.flowctl("run", "get", "nope")
	if code != 2 || strings.TrimSpace(errOut) != `flowctl: run "nope" not found` {
		t.Fatalf("run get nope: exit %d %q, want 2 and `run \"nope\" not found`", code, errOut)
	}
	if _, _, errOut := e.flowctl("workflow", "show", "nope"); strings.Contains(errOut, "checkpoint") || !strings.Contains(errOut, `workflow "nope" not found`) {
		t.Fatalf("workflow show nope: %q", errOut)
	}
}

// An int input keeps every digit from flowctl to the stored run and back: through
// float64 9007199254740993 arrived as ...992.
func TestIntInputExactThroughFlowctl(t *testing.T) {
	e := startFlowd(t)
	wf := e.file("n.yaml", "name: n\ninputs:\n  n: {type: int}\nsteps:\n  - name: a\n    uses: noop\n    with: {n: \"{{ inputs.n }}\"}\n")
	if code, _, errOut := e.flowctl("workflow", "apply", "-f", wf); code != 0 {
		t.Fatalf("apply: %d %s", code, errOut)
	}
	code, out, errOut := e.flowctl("run", "start", "n", "--input", "n=9007199254740993", "--wait", "-o", "json")
	if code != 0 {
		t.Fatalf("start: %d %s %s", code, out, errOut)
	}
	var started struct{ ID string }
	if err := json.Unmarshal([]byte(out), &started); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	code, out, _ = e.flowctl("run", "get", started.ID, "-o", "json")
	if code != 0 || !strings.Contains(out, `"n": 9007199254740993`) || strings.Count(out, "9007199254740993") != 2 {
		t.Fatalf("run get: %d, want the input and the step's output exact:\n%s", code, out)
	}
}

// A node ID that is no valid KV key or subject token is refused at start, naming the flag.
func TestNodeIDRule(t *testing.T) {
	for _, id := range []string{"a.", "a..b", "-a"} {
		_, err := daemon.Load([]string{"--node-id", id}, nil)
		if err == nil || !strings.Contains(err.Error(), "node-id") {
			t.Errorf("--node-id %q: %v, want an error naming --node-id", id, err)
		}
	}
}

// `workflow apply -f a.yaml -f b.yaml` applies both, in order, each file's outcome
// printed; it once applied only b.yaml, silently (issue 38). Any file that is not valid
// (here or on the server: an unknown kind is the server's to judge), and two files of
// one workflow, are refused with the file named, and nothing is applied.
func TestApplyRepeatedFile(t *testing.T) {
	e := startFlowd(t)
	a := e.file("a.yaml", "name: wf-a\nsteps:\n  - name: s\n    uses: noop\n")
	b := e.file("b.yaml", "name: wf-b\nsteps:\n  - name: s\n    uses: noop\n")
	code, out, errOut := e.flowctl("workflow", "apply", "-f", a, "-f", b)
	if code != 0 {
		t.Fatalf("apply -f a -f b: exit %d %s", code, errOut)
	}
	ia, ib := strings.Index(out, "a.yaml: workflow wf-a applied: version 1"), strings.Index(out, "b.yaml: workflow wf-b applied: version 1")
	if ia < 0 || ib < ia {
		t.Fatalf("apply -f a -f b printed, want a's line then b's:\n%s", out)
	}
	for _, name := range []string{"wf-a", "wf-b"} {
		if code, _, errOut := e.flowctl("workflow", "show", name); code != 0 {
			t.Fatalf("workflow show %s after apply -f a -f b: exit %d %s", name, code, errOut)
		}
	}

	c := e.file("c.yaml", "name: wf-c\nsteps:\n  - name: s\n    uses: noop\n")
	kind := e.file("kind.yaml", "name: wf-k\nsteps:\n  - name: s\n    uses: teleport\n")
	broken := e.file("broken.yaml", "name: wf-x\nsteps: [\n")
	twin := e.file("twin.yaml", "name: wf-c\nsteps:\n  - name: t\n    uses: noop\n")
	dir := filepath.Join(e.dir, "more")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	applied := e.d.Engine().Applied()
	for _, tc := range []struct {
		files []string
		want  []string
	}{
		{[]string{c, kind}, []string{`kind.yaml:4:11: step "s" uses unknown kind "teleport"`}},
		{[]string{broken, c}, []string{"broken.yaml:", "not valid YAML"}},
		{[]string{c, twin}, []string{"c.yaml and", `twin.yaml both define workflow "wf-c"`}},
		{[]string{c, filepath.Join(e.dir, "nope.yaml")}, []string{"nope.yaml"}},
		{[]string{c, dir}, []string{"more: the directory holds no .yaml or .yml file"}},
	} {
		args := []string{"workflow", "apply"}
		for _, f := range tc.files {
			args = append(args, "-f", f)
		}
		code, out, errOut := e.flowctl(args...)
		if code != 2 || out != "" {
			t.Errorf("apply %v: exit %d, stdout %q; want 2 and nothing printed", tc.files, code, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("apply %v: %q does not say %q", tc.files, errOut, w)
			}
		}
		if !strings.Contains(errOut, "nothing was applied") {
			t.Errorf("apply %v: %q does not say that nothing was applied", tc.files, errOut)
		}
	}
	if got := e.d.Engine().Applied(); got != applied {
		t.Fatalf("refused applies wrote to the log: applied %d -> %d", applied, got)
	}
	if code, _, _ := e.flowctl("workflow", "show", "wf-c"); code != 2 {
		t.Fatalf("wf-c was applied beside a refused file: workflow show exit %d", code)
	}
}
