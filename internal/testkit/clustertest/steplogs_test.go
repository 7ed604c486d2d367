package clustertest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
)

// logLines reads every line of run id's step logs with `flowctl run logs -o json` (one
// object per line, as the contract says) and fails the test on anything else.
func logLines(t *testing.T, url, id string, args ...string) []client.LogLine {
	t.Helper()
	out := mustFlowctl(t, url, append([]string{"run", "logs", id, "-o", "json"}, args...)...)
	var lines []client.LogLine
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l client.LogLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("run logs -o json: a line that is not one object: %q: %v", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	return lines
}

// A real flowd keeps what its steps print. A step printing 10 MB keeps the first
// --step-log-limit of it (1 MiB, the default) and a marker of where it stopped and how
// much was not kept; the step itself succeeds. `run logs --follow` prints a running
// step's first line while the step still runs: the step waits for a file that the test
// creates only once the follower has printed that line, and the follower ends with the
// run, with the step's last line.
func TestStepLogsOfARealFlowd(t *testing.T) {
	t.Parallel()
	_, url, _ := embeddedFlowd(t)
	dir := t.TempDir()
	gate, err := os.MkdirTemp("", "flow-steplogs-") // the step's user (nobody) checks a file in it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(gate) })
	if err := os.Chmod(gate, 0o777); err != nil {
		t.Fatal(err)
	}
	applyYAML(t, url, dir, "loud", `name: loud
steps:
  - name: print
    uses: exec
    with:
      command: ["sh", "-c", "head -c 10485760 /dev/zero | tr '\\0' 'x' | fold -w 1000 >&2; echo done"]
`)
	mustFlowctl(t, url, "run", "start", "loud", "--id", "loud-1", "--wait")
	lines := logLines(t, url, "loud-1")
	kept, marker, count := 0, false, false
	for _, l := range lines {
		switch {
		case l.Stream == "stderr":
			kept += len(l.Line) + 1
		case l.Stream == "flow" && strings.Contains(l.Line, "log truncated"):
			marker = true
		case l.Stream == "flow" && strings.Contains(l.Line, "were not kept"):
			count = true
		}
		if l.Step != "print" || l.Attempt != 1 || l.Epoch == 0 || l.Item != nil {
			t.Fatalf("line %+v: want step print, attempt 1, an epoch, no item", l)
		}
	}
	if kept > 1<<20 || kept < 1<<20-2000 || !marker || !count {
		t.Fatalf("10 MB printed: %d bytes kept (want just under 1 MiB), marker %v, count %v", kept, marker, count)
	}

	applyYAML(t, url, dir, "slow", fmt.Sprintf(`name: slow
steps:
  - name: talk
    uses: exec
    with:
      command: ["sh", "-c", "echo first; while [ ! -e %s/go ]; do sleep 0.05; done; echo second"]
`, gate))
	mustFlowctl(t, url, "run", "start", "slow", "--id", "slow-1")
	cl, err := client.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var got []string
	err = cl.FollowLogs(ctx, "slow-1", client.LogOptions{}, 100*time.Millisecond, func(l client.LogLine) {
		got = append(got, l.Line)
		if l.Line == "first" {
			if r := runOf(t, url, "slow-1"); r.Status != "running" {
				t.Errorf("the first line came with the run %s; want it while the step runs", r.Status)
			}
			if err := os.WriteFile(filepath.Join(gate, "go"), nil, 0o644); err != nil {
				t.Error(err)
			}
		}
	})
	if err != nil || strings.Join(got, ",") != "first,second" {
		t.Fatalf("follow: %v, lines %q; want first, second", err, got)
	}
}

// A secret input (`secret: true`) never shows in what the step prints, in its output,
// in the run's error or in its inputs as run get shows them: *** stands for it. Control:
// flowd linked with the masking off (worker.noMasking): the step's log and output carry
// the secret.
func TestSecretInputIsMasked(t *testing.T) {
	t.Parallel()
	const secret = "tok-9f8e7d6c5b4a"
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "masked", true: "control-masking-off"}[control], func(t *testing.T) {
			var url string
			if control {
				_, url, _ = embeddedFlowdBin(t, FlowdLinkedWith(t, "github.com/flowrun/flow/engine/internal/worker.noMasking=1"))
			} else {
				_, url, _ = embeddedFlowd(t)
			}
			dir := t.TempDir()
			applyYAML(t, url, dir, "pay", `name: pay
inputs:
  token: {type: string, secret: true}
steps:
  - name: call
    uses: exec
    with:
      command: ["sh", "-c", "echo \"calling with $T\" >&2; echo \"{\\\"sent\\\": \\\"$T\\\"}\""]
      env: {T: "{{ inputs.token }}"}
  - name: fail
    needs: [call]
    uses: exec
    with:
      command: ["sh", "-c", "echo \"bad token $T\" >&2; exit 3"]
      env: {T: "{{ inputs.token }}"}
`)
			if code, out := flowctl(url, "run", "start", "pay", "--id", "p-1", "--input", "token="+secret, "--wait"); code != 1 {
				t.Fatalf("the run: exit %d: %s", code, out)
			}
			logs := mustFlowctl(t, url, "run", "logs", "p-1", "-o", "json")
			run := mustFlowctl(t, url, "run", "get", "p-1", "-o", "json")
			list := mustFlowctl(t, url, "run", "list", "-o", "json")
			leaked := strings.Contains(logs, secret) || strings.Contains(run, secret)
			if control {
				if !strings.Contains(logs, secret) || !strings.Contains(run, `"sent": "`+secret) {
					t.Fatalf("control: with the masking off the secret should be in the log and the output:\n%s\n%s", logs, run)
				}
				return
			}
			if leaked || strings.Contains(list, secret) {
				t.Fatalf("the secret leaked:\nlogs %s\nrun %s\nlist %s", logs, run, list)
			}
			if !strings.Contains(logs, "calling with ***") || !strings.Contains(logs, "bad token ***") || !strings.Contains(run, `"sent": "***"`) ||
				!strings.Contains(run, `"token": "***"`) {
				t.Fatalf("want *** in its place:\nlogs %s\nrun %s", logs, run)
			}
		})
	}
}

// A step killed mid-print because its epoch ended keeps what it printed, under that
// epoch: the flowd running it is frozen (SIGSTOP), the step's init stops it at the
// lease's trust deadline, another node takes the run over with a new epoch and runs the
// step again to its end. `run logs` shows both epochs' lines, each marked with its own.
func TestLinesOfAKilledEpochAreKept(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and freezes flowd processes")
	}
	t.Parallel()
	url := startNATSServer(t)
	c := &Cluster{URLs: []string{url}}
	a := StartFlowd(t, c, "node-a", "--lease-ttl", "2s")
	cl := dial(t, c)
	WaitFor(t, 30*time.Second, "the workflow applied", func() bool {
		return call(t, cl, "workflow.apply", client.Request{File: "ticker.yaml", YAML: `name: ticker
steps:
  - name: tick
    uses: exec
    with:
      command: ["sh", "-c", "i=1; while [ $i -le 100 ]; do echo tick $i; i=$((i+1)); sleep 0.05; done"]
`}, nil) == nil
	})
	mustFlowctl(t, url, "run", "start", "ticker", "--id", "t-1")
	var first client.LogLine
	WaitFor(t, 60*time.Second, "the first epoch's lines", func() bool {
		var page client.StepLogPage
		if call(t, cl, "run.logs", client.Request{ID: "t-1"}, &page) != nil || len(page.Lines) < 3 {
			return false
		}
		first = page.Lines[0]
		return true
	})
	StartFlowd(t, c, "node-b", "--lease-ttl", "2s")
	WaitFor(t, 30*time.Second, "node-b in the cluster", func() bool {
		var st client.ClusterStatus
		return call(t, cl, "cluster.status", client.Request{}, &st) == nil && len(st.Nodes) == 2
	})
	a.Stop()
	WaitFor(t, 2*time.Minute, "node-b to run the step to its end", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var r client.Run
		return callCtx(ctx, cl, "run.get", client.Request{ID: "t-1"}, &r) == nil && r.Status == "succeeded"
	})
	a.Cont()
	lines := logLines(t, url, "t-1")
	byEpoch := map[int64][]string{}
	for _, l := range lines {
		byEpoch[l.Epoch] = append(byEpoch[l.Epoch], l.Line)
	}
	old, last := byEpoch[first.Epoch], int64(0)
	for e := range byEpoch {
		last = max(last, e)
	}
	if len(old) < 3 || old[0] != "tick 1" || len(old) >= 100 {
		t.Fatalf("epoch %d (killed mid-print): %d lines %q...; want its first lines, not all 100", first.Epoch, len(old), old[:min(3, len(old))])
	}
	if newer := byEpoch[last]; last <= first.Epoch || len(newer) != 100 || newer[99] != "tick 100" {
		t.Fatalf("epoch %d (the takeover): %d lines; want all 100 under an epoch after %d", last, len(newer), first.Epoch)
	}
	t.Logf("epoch %d kept %d lines of its killed step; epoch %d printed all 100", first.Epoch, len(old), last)
}
