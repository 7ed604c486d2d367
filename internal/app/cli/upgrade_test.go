package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/flowrun/flow/client"
)

// cluster status says the cluster version and each node's binary and formats; hold and
// unhold show in it; forget refuses a live node and a stranger; log dump prints every
// message, of either format, as a JSON line (-o json: an array), --run one run's.
func TestClusterVersionCommandsAndLogDump(t *testing.T) {
	e := startFlowd(t)
	code, out, errOut := e.flowctl("cluster", "status", "-o", "json")
	var st client.ClusterStatus
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("cluster status: %d %s %s", code, out, errOut)
	}
	if st.ClusterVersion != 3 || len(st.Nodes) != 1 || st.Nodes[0].Binary == "" || len(st.Nodes[0].Formats) != 3 ||
		len(st.Members) != 1 || !st.Members[0].Live || st.Members[0].ID != "node-a" {
		t.Fatalf("cluster status: %s", out)
	}
	for _, k := range []string{`"cluster_version": 3`, `"binary"`, `"formats"`, `"members"`} {
		if !strings.Contains(out, k) {
			t.Errorf("cluster status -o json lacks %s:\n%s", k, out)
		}
	}
	if code, _, errOut := e.flowctl("cluster", "hold", "--reason", "trying 0.9"); code != 0 {
		t.Fatalf("cluster hold: %d %s", code, errOut)
	}
	if _, out, _ := e.flowctl("cluster", "status"); !strings.Contains(out, "trying 0.9") || !strings.Contains(out, "HOLD") {
		t.Fatalf("cluster status after a hold:\n%s", out)
	}
	if code, _, errOut := e.flowctl("cluster", "unhold"); code != 0 {
		t.Fatalf("cluster unhold: %d %s", code, errOut)
	}
	if _, out, _ := e.flowctl("cluster", "status", "-o", "json"); strings.Contains(out, `"hold"`) {
		t.Fatalf("the hold stayed:\n%s", out)
	}
	if code, _, errOut := e.flowctl("cluster", "forget", "node-a"); code == 0 || !strings.Contains(errOut, "alive") {
		t.Fatalf("forget a live node: %d %q; want refused, saying it is alive", code, errOut)
	}
	if code, _, errOut := e.flowctl("cluster", "forget", "node-x"); code == 0 || !strings.Contains(errOut, "not a member") {
		t.Fatalf("forget a stranger: %d %q", code, errOut)
	}

	wf := e.file("hello.yaml", "name: hello\nsteps:\n  - name: a\n    uses: noop\n")
	if code, _, errOut := e.flowctl("workflow", "apply", "-f", wf); code != 0 {
		t.Fatalf("apply: %d %s", code, errOut)
	}
	if code, out, errOut := e.flowctl("run", "start", "hello", "--id", "r-1", "--wait"); code != 0 {
		t.Fatalf("run: %d %s %s", code, out, errOut)
	}
	code, out, errOut = e.flowctl("log", "dump")
	if code != 0 {
		t.Fatalf("log dump: %d %s", code, errOut)
	}
	formats := map[int]int{}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for _, l := range lines {
		var m client.LogMessage
		if err := json.Unmarshal([]byte(l), &m); err != nil || m.Seq == 0 || len(m.Entries) == 0 {
			t.Fatalf("log dump line %q: %v", l, err)
		}
		formats[m.Format]++
	}
	if formats[1] == 0 || formats[3] == 0 {
		t.Fatalf("log dump: messages by format %v; want both (format 1 until the raise, 3 after)", formats)
	}
	code, out, _ = e.flowctl("log", "dump", "--run", "r-1", "--from", "2", "-o", "json")
	var msgs []client.LogMessage
	if code != 0 || json.Unmarshal([]byte(out), &msgs) != nil || len(msgs) == 0 {
		t.Fatalf("log dump --run -o json: %d %s", code, out)
	}
	for _, m := range msgs {
		for _, raw := range m.Entries {
			var en struct {
				Run string `json:"run"`
			}
			if json.Unmarshal(raw, &en) != nil || en.Run != "r-1" {
				t.Fatalf("log dump --run r-1 printed %s", raw)
			}
		}
	}
	if code, _, errOut := e.flowctl("log", "dump", "--run", "a b"); code != 2 || !strings.Contains(errOut, "run ID") {
		t.Fatalf("log dump --run 'a b': %d %q; want 2 and the ID rule", code, errOut)
	}
}

// run start --traceparent: a bad one is refused at the door (exit 2, the form named),
// nothing started; a good one starts the run.
func TestRunStartTraceparent(t *testing.T) {
	e := startFlowd(t)
	wf := e.file("hello.yaml", "name: hello\nsteps:\n  - name: a\n    uses: noop\n")
	if code, _, errOut := e.flowctl("workflow", "apply", "-f", wf); code != 0 {
		t.Fatalf("apply: %d %s", code, errOut)
	}
	applied := e.d.Engine().Applied()
	if code, _, errOut := e.flowctl("run", "start", "hello", "--traceparent", "00-nope-01"); code != 2 || !strings.Contains(errOut, "W3C") {
		t.Fatalf("a bad traceparent: %d %q; want 2 and the form", code, errOut)
	}
	if got := e.d.Engine().Applied(); got != applied {
		t.Fatalf("a refused start wrote to the log: %d -> %d", applied, got)
	}
	if code, out, errOut := e.flowctl("run", "start", "hello", "--wait", "--traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"); code != 0 {
		t.Fatalf("a good traceparent: %d %s %s", code, out, errOut)
	}
}
