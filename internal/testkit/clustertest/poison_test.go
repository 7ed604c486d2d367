package clustertest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/app/cli"
)

// flowctl runs the CLI in process against server and returns its exit code and stdout.
func flowctl(server string, args ...string) (int, string) {
	var out, errOut bytes.Buffer
	code := cli.Run(append([]string{"--server", server}, args...), &out, &errOut, func(string) string { return "" })
	return code, out.String() + errOut.String()
}

// A poison run: its second step has the flowd running it SIGKILLed (it asks the test,
// through a file: in its PID namespace a step cannot signal flowd, docs/security.md). The test restarts the
// node each time it dies; every restart reclaims the run with a new epoch (counted:
// ownership was lost), until more than max_epochs changes would have happened and the
// run is dead-lettered instead, with its owner history. Once the poison is gone, a DLQ
// retry gives it a new epoch and it resumes from its checkpoints: the first step does not
// run again. Invariant 5 of DESIGN.md.
func TestPoisonRunEndsInTheDLQ(t *testing.T) {
	if testing.Short() {
		t.Skip("kills flowd processes")
	}
	t.Parallel() // no timing assertion: it runs beside the others (docs/testing.md, "How the suite is run")
	bin := Binaries(t)
	dir := t.TempDir()
	poison := filepath.Join(dir, "poison")
	sideEffects := filepath.Join(dir, "side-effects")
	killMe := filepath.Join(dir, "kill-me") // the poison step's request: SIGKILL my flowd
	os.WriteFile(poison, nil, 0o644)
	wf := filepath.Join(dir, "poison.yaml")
	os.WriteFile(wf, []byte(fmt.Sprintf(`name: poison
max_epochs: 2
steps:
  - name: first
    uses: exec
    with: {command: [sh, -c, "echo first >> %s; echo '{}'"]}
  - name: killer
    needs: [first]
    uses: exec
    with: {command: [sh, -c, "if [ -e %s ]; then touch %s; sleep 5; fi; echo '{}'"]}
`, sideEffects, poison, killMe)), 0o644)
	port := freePorts(t, 1)[0]
	server := fmt.Sprintf("nats://127.0.0.1:%d", port)
	logf, _ := os.Create(filepath.Join(dir, "flowd.log"))
	node := &Proc{Name: "flowd", log: logf, args: []string{filepath.Join(bin, "flowd"), "--node-id", "node-a",
		"--data-dir", filepath.Join(dir, "data"), "--nats-listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--http", "off", "--lease-ttl", "1s", "--log-format", "json"}}
	node.args = append(node.args, stepsAsTestUser()...) // its steps write the test's own files
	node.start(t)
	t.Cleanup(node.Kill)
	// Ready: flowd answers, or it died again first (the run it resumed at once can kill it
	// before its API answers; the loop below counts that death). Its log is shown if not.
	ready := func() {
		deadline := time.Now().Add(60 * time.Second)
		for {
			if !node.Alive() {
				return
			}
			if code, _ := flowctl(server, "cluster", "status"); code == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("flowd did not answer within 60s; its log:\n%s", LogOf(node))
			}
			time.Sleep(20 * time.Millisecond) // polling a child process, with a deadline
		}
	}
	ready()
	if code, out := flowctl(server, "workflow", "apply", "-f", wf); code != 0 {
		t.Fatal(out)
	}
	if code, out := flowctl(server, "run", "start", "poison", "--id", "poison-1"); code != 0 {
		t.Fatal(out)
	}
	deaths := 0
	status := func() client.Run {
		var r client.Run
		code, out := flowctl(server, "run", "get", "poison-1", "-o", "json")
		if code == 0 {
			_ = json.Unmarshal([]byte(out), &r)
		}
		return r
	}
	giveUp := time.Now().Add(3 * time.Minute)
	for {
		if time.Now().After(giveUp) {
			t.Fatalf("the run was neither dead-lettered nor failed within 3 minutes (%d deaths): %+v\n%s", deaths, status(), tail(LogOf(node)))
		}
		select {
		case <-node.done:
			deaths++
			if deaths > 6 {
				t.Fatalf("flowd died %d times and the run is not dead-lettered:\n%s", deaths, LogOf(node))
			}
			node.Restart(t)
			ready()
			continue
		case <-time.After(100 * time.Millisecond): // watching a child process and the run's status
		}
		if os.Remove(killMe) == nil {
			node.Kill() // the poison step's doing; counted as a death above, next time round
			continue
		}
		if r := status(); r.Status == "dead_lettered" {
			if r.EpochChanges != 2 || r.MaxEpochs != 2 || len(r.Epochs) != 3 || r.DeadLetter == "" {
				t.Fatalf("dead-lettered run: %+v", r)
			}
			for _, e := range r.Epochs {
				if e.Owner != "node-a" {
					t.Fatalf("epoch %d has owner %q", e.Epoch, e.Owner)
				}
			}
			break
		} else if deaths == 0 && r.Status == "failed" {
			t.Fatalf("run failed instead: %+v", r)
		}
	}
	if deaths != 3 {
		t.Fatalf("flowd died %d times; with max_epochs 2 the run must be dead-lettered at the fourth owner", deaths)
	}
	// The poison is fixed; the operator retries from the DLQ.
	os.Remove(poison)
	if code, out := flowctl(server, "dlq", "retry", "poison-1"); code != 0 {
		t.Fatal(out)
	}
	WaitFor(t, 30*time.Second, "the retried run to succeed", func() bool { return status().Status == "succeeded" })
	r := status()
	if last := r.Epochs[len(r.Epochs)-1]; last.Reason != "retried" || r.EpochChanges != 0 {
		t.Fatalf("after retry: %+v", r.Epochs)
	}
	data, _ := os.ReadFile(sideEffects)
	if n := strings.Count(string(data), "first"); n != 1 {
		t.Fatalf("the first step ran %d times; a resumed run never re-runs a checkpointed step", n)
	}
}
