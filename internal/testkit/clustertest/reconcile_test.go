package clustertest

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
)

// Reconcile: the whole cluster (three flowd nodes) is SIGKILLed in the middle of runs
// and started again: every run finishes, every step is committed once. Each step records
// its side effect with its epoch in a file, outside the store (which would fence a second
// commit whatever the engine did): no step runs in an epoch after the one that
// checkpointed it; a step runs in an earlier epoch only if it was its run's step in
// flight at the kill, and then once more in the run's next epoch; no write is fenced (no
// zombie: every node died); a run changed epoch once if it was running at the kill, and
// never otherwise. Invariant 6 of DESIGN.md.
func TestWholeClusterRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("kills flowd processes")
	}
	url := startNATSServer(t)
	c := &Cluster{URLs: []string{url}}
	dir := t.TempDir()
	effects := filepath.Join(dir, "effects")
	var names []string
	nodes := map[string]*Proc{}
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		nodes[n] = StartFlowd(t, c, n, append([]string{"--lease-ttl", "1s"}, stepsAsTestUser()...)...) // its steps write the test's files
		names = append(names, n)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range names {
				t.Logf("%s's log, warnings and up:\n%s", n, importantLines(LogOf(nodes[n]), 40))
			}
		}
	})
	cl := dial(t, c)
	WaitFor(t, 30*time.Second, "three nodes", func() bool {
		var st client.ClusterStatus
		return call(t, cl, "cluster.status", client.Request{}, &st) == nil && st.Leader != "" && len(st.Nodes) == 3
	})
	yaml := "name: work\nmax_epochs: 10\nsteps:\n"
	for i := 1; i <= 4; i++ {
		yaml += fmt.Sprintf("  - name: s%d\n    uses: exec\n    with: {command: [sh, -c, \"echo $FLOW_RUN_ID s%d $FLOW_EPOCH >> %s; sleep 0.3; echo '{}'\"]}\n", i, i, effects)
		if i > 1 {
			yaml += fmt.Sprintf("    needs: [s%d]\n", i-1)
		}
	}
	if err := call(t, cl, "workflow.apply", client.Request{File: "work.yaml", YAML: yaml}, nil); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := 0; i < 8; i++ {
		var res map[string]string
		if err := call(t, cl, "run.start", client.Request{Workflow: "work"}, &res); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res["id"])
	}
	WaitFor(t, 30*time.Second, "runs half way", func() bool {
		data, _ := os.ReadFile(effects)
		return strings.Count(string(data), "\n") >= 12
	})
	for _, n := range names {
		nodes[n].Kill()
	}
	// The side effects written before the kill (each node is dead, and with it each step's
	// shell, Pdeathsig).
	atKill := readEffects(t, effects)
	for _, n := range names {
		nodes[n].Restart(t)
	}
	for _, id := range ids {
		WaitFor(t, 60*time.Second, "run "+id, func() bool {
			var r client.Run
			return call(t, cl, "run.get", client.Request{ID: id}, &r) == nil && r.Status == "succeeded"
		})
		var v client.Verification
		if err := call(t, cl, "run.verify", client.Request{ID: id}, &v); err != nil || !v.OK {
			t.Fatalf("verify %s: %v %+v", id, err, v)
		}
	}
	got := readEffects(t, effects)
	repeats, changes, running := 0, 0, 0
	for _, id := range ids {
		var r client.Run
		var history []client.Event
		if err := call(t, cl, "run.get", client.Request{ID: id}, &r); err != nil {
			t.Fatal(err)
		}
		if err := call(t, cl, "run.history", client.Request{ID: id}, &history); err != nil {
			t.Fatal(err)
		}
		cp := map[string]int64{} // step: the epoch of its checkpoint
		for _, ev := range history {
			if ev.Kind == "commit" && ev.Outcome == "accepted" {
				if _, ok := cp[ev.Step]; ok {
					t.Errorf("%s %s checkpointed twice", id, ev.Step)
				}
				cp[ev.Step] = ev.Epoch
			}
		}
		var epochs []int64
		for _, e := range r.Epochs {
			epochs = append(epochs, e.Epoch)
		}
		// The run's step in flight at the kill, if it had begun its side effect: its last.
		var inFlight sideEffect
		ranBefore, finishing := false, false
		for _, e := range atKill {
			if e.run == id {
				inFlight, ranBefore, finishing = e, true, finishing || e.step == "s4"
			}
		}
		byStep := map[string][]sideEffect{}
		for _, e := range got {
			if e.run == id {
				byStep[e.step] = append(byStep[e.step], e)
			}
		}
		for i := 1; i <= 4; i++ {
			step := fmt.Sprintf("s%d", i)
			E, ok := cp[step]
			if !ok {
				t.Errorf("%s %s has no checkpoint", id, step)
				continue
			}
			inE := 0
			for _, e := range byStep[step] {
				switch {
				case e.epoch > E: // (a) a checkpointed step never runs again
					t.Errorf("%s %s ran again in epoch %d after its checkpoint in epoch %d (run epochs %v)", id, step, e.epoch, E, epochs)
				case e.epoch == E:
					inE++
				default: // (b) only the step in flight at the kill, in the killed epoch, then in the next
					repeats++
					if e != inFlight || nextEpoch(epochs, e.epoch) != E {
						t.Errorf("%s %s ran in epoch %d and was checkpointed in epoch %d, although it was not the run's step in flight at the kill (%+v) followed by the next epoch (run epochs %v)",
							id, step, e.epoch, E, inFlight, epochs)
					}
				}
			}
			if inE != 1 {
				t.Errorf("%s %s ran %d times in its checkpoint's epoch %d", id, step, inE, E)
			}
		}
		// (c) every node died: no zombie could write with an old epoch.
		if len(r.Fenced) != 0 {
			t.Errorf("%s: fenced writes %+v", id, r.Fenced)
		}
		// (d) one kill: one counted epoch change for a run that was running at it (it had
		// run a step and not begun its last), none for one that was not (not yet claimed:
		// a lost task's new epoch does not count; or finished). A run whose side effects
		// show neither (none yet, or its last step begun) may have been either.
		sure := ranBefore && !finishing
		if sure {
			running++
		}
		if (sure && r.EpochChanges != 1) || r.EpochChanges > 1 {
			t.Errorf("%s: %d epoch changes (running at the kill by its side effects: %v), epochs %+v", id, r.EpochChanges, sure, r.Epochs)
		}
		changes += r.EpochChanges
	}
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("8 runs x 4 steps across a whole-cluster kill: %d epoch changes (%d runs surely running at the kill); %d steps in flight at the kill ran again", changes, running, repeats)
}

type sideEffect struct {
	run, step string
	epoch     int64
}

// readEffects reads the steps' side effects, "<run> <step> <epoch>" a line.
func readEffects(t *testing.T, file string) []sideEffect {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []sideEffect
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var e sideEffect
		if n, err := fmt.Sscanf(l, "%s %s %d", &e.run, &e.step, &e.epoch); n != 3 || err != nil {
			t.Fatalf("effect %q: %v", l, err)
		}
		out = append(out, e)
	}
	return out
}

func nextEpoch(epochs []int64, e int64) int64 {
	if i := slices.Index(epochs, e); i >= 0 && i+1 < len(epochs) {
		return epochs[i+1]
	}
	return -1
}
