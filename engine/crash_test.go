package engine

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
)

type crashNode struct {
	t      *testing.T
	dir    string
	wfFile string
	runs   string
	record string
}

// start launches the node; lines of its output arrive on the returned channel.
func (n *crashNode) start() (*exec.Cmd, <-chan string) {
	exe, err := os.Executable()
	if err != nil {
		n.t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), "FLOW_ENGINE_HELPER="+n.dir, "FLOW_ENGINE_HELPER_WORKFLOW="+n.wfFile,
		"FLOW_ENGINE_HELPER_RUNS="+n.runs, "FLOW_ENGINE_HELPER_RECORD="+n.record)
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "error") {
				n.t.Errorf("node: %s", sc.Text())
			}
			lines <- sc.Text()
		}
	}()
	return cmd, lines
}

func recordLines(t *testing.T, file string) []string {
	data, err := os.ReadFile(file)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// waitLines waits until the record file has more than n lines, or the node ends.
func waitLines(t *testing.T, file string, n int, lines <-chan string) bool {
	deadline := time.Now().Add(30 * time.Second)
	for len(recordLines(t, file)) <= n {
		select {
		case l, ok := <-lines:
			if !ok || l == "all-done" {
				return false
			}
		case <-time.After(5 * time.Millisecond): // polling a file a child process writes
		}
		if time.Now().After(deadline) {
			t.Fatalf("no progress past %d lines in 30s", n)
		}
	}
	return true
}

// Crash resume: runs of 10 exec-like steps (each appends its name to a file, then
// works a while) in a node SIGKILLed at random points and restarted, 20 times. Every
// checkpointed step appears exactly once; a step appears twice only if it was the one
// in flight at a kill (its idempotency key is the same both times: it is the same
// (run, step, item)). Invariant 3 of DESIGN.md.
func TestCrashResume(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes")
	}
	dir := t.TempDir()
	// s01 -> w01 -> s02 -> w02 ...: sNN records its side effect, wNN works a while.
	var wf strings.Builder
	wf.WriteString("name: crashy\nmax_epochs: 100 # every kill costs an epoch change\nsteps:\n")
	for i := 1; i <= 10; i++ {
		fmt.Fprintf(&wf, "  - name: s%02d\n    uses: record\n    with: {hold: 60ms}\n", i)
		if i > 1 {
			fmt.Fprintf(&wf, "    needs: [w%02d]\n", i-1)
		}
		fmt.Fprintf(&wf, "  - name: w%02d\n    needs: [s%02d]\n    uses: sleep\n    with: {duration: 120ms}\n", i, i)
	}
	yaml := wf.String()
	wfFile := filepath.Join(dir, "crash.yaml")
	if err := os.WriteFile(wfFile, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	runs := []string{"run-1", "run-2", "run-3", "run-4", "run-5", "run-6"}
	node := &crashNode{t: t, dir: filepath.Join(dir, "data"), wfFile: wfFile, runs: strings.Join(runs, ","), record: filepath.Join(dir, "record.txt")}
	rng := rand.New(rand.NewPCG(1, 2))
	var killedAt []int // record line counts at each kill
	finished := false
	for kill := 0; kill < 20 && !finished; kill++ {
		cmd, lines := node.start()
		before := len(recordLines(t, node.record))
		if !waitLines(t, node.record, before+rng.IntN(3), lines) {
			finished = true
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
		killedAt = append(killedAt, len(recordLines(t, node.record)))
	}
	if len(killedAt) < 20 {
		t.Fatalf("the runs finished after %d kills; make them longer", len(killedAt))
	}
	cmd, lines := node.start()
	waitAllDone(t, cmd, lines, 2*time.Minute)
	got := recordLines(t, node.record)
	kills := map[int]bool{}
	for _, k := range killedAt {
		kills[k] = true
	}
	// Walk the side effects: a repeat is allowed only right after a kill, of the step
	// that was the last one written before it.
	seenAt := map[string]int{}
	repeats := 0
	for i, l := range got {
		if prev, ok := seenAt[l]; ok {
			if !kills[prev+1] {
				t.Fatalf("%q ran again (line %d) although it was not in flight at a kill (first at line %d; kills after lines %v)", l, i+1, prev+1, killedAt)
			}
			repeats++
		}
		seenAt[l] = i
	}
	// Every step of every run is checkpointed exactly once.
	store, err := checkpoint.OpenStore(filepath.Join(node.dir, "state"), checkpoint.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	for _, id := range runs {
		v, err := store.View(id)
		if err != nil {
			t.Fatal(err)
		}
		if v.Run.Status != checkpoint.StatusSucceeded {
			t.Fatalf("%s: %s %s", id, v.Run.Status, v.Run.Error)
		}
		for _, s := range v.Steps {
			if n := countAccepted(v, s.Name); n != 1 {
				t.Fatalf("%s step %s accepted %d times", id, s.Name, n)
			}
		}
	}
	if repeats == 0 {
		t.Fatalf("no kill landed inside a step: the test did not exercise the in-flight case")
	}
	t.Logf("20 kills over %d runs; %d side effects, %d repeated (each in flight at a kill)", len(runs), len(got), repeats)
}

// A foreach of 1,000 items killed midway resumes at the first unfinished item: after
// the restart exactly the items without a checkpoint run, each once.
func TestForeachResumesAfterKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a process")
	}
	dir := t.TempDir()
	nums := make([]string, 1000)
	for i := range nums {
		nums[i] = fmt.Sprint(i)
	}
	yaml := "name: fan\nmax_epochs: 10\nsteps:\n  - name: list\n    uses: noop\n    with: {n: [" + strings.Join(nums, ",") + "]}\n" +
		"  - name: each\n    needs: [list]\n    foreach: \"{{ steps.list.output.n }}\"\n    parallelism: 4\n    uses: record\n    with: {hold: 1ms}\n"
	wfFile := filepath.Join(dir, "fan.yaml")
	if err := os.WriteFile(wfFile, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	node := &crashNode{t: t, dir: filepath.Join(dir, "data"), wfFile: wfFile, runs: "fan-1", record: filepath.Join(dir, "record.txt")}
	cmd, lines := node.start()
	if !waitLines(t, node.record, 400, lines) {
		t.Fatal("finished before the kill")
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	atKill := len(recordLines(t, node.record))
	cmd, lines = node.start()
	waitAllDone(t, cmd, lines, 2*time.Minute)
	// The checkpoints the killed epoch made are the items carrying its epoch (some were
	// in the log but not yet applied to the state when the process died).
	store, err := checkpoint.OpenStore(filepath.Join(node.dir, "state"), checkpoint.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v, err := store.View("fan-1")
	store.Close()
	if err != nil {
		t.Fatal(err)
	}
	if v.Run.Status != checkpoint.StatusSucceeded || len(v.Run.Epochs) < 2 {
		t.Fatalf("run %s epochs %+v", v.Run.Status, v.Run.Epochs)
	}
	killedEpoch := v.Run.Epochs[0].Epoch
	done := map[int]bool{}
	for _, it := range v.Steps[1].ItemCheckpoints {
		if it.Epoch == killedEpoch {
			done[it.Index] = true
		}
	}
	firstUnfinished := 0
	for done[firstUnfinished] {
		firstUnfinished++
	}
	after := recordLines(t, node.record)[atKill:]
	ran := map[int]int{}
	minRan := 1 << 30
	for _, l := range after {
		var run, step string
		var item int
		fmt.Sscanf(l, "%s %s %d", &run, &step, &item)
		if step != "each" {
			continue
		}
		if done[item] {
			t.Fatalf("item %d ran again after the restart although it was checkpointed", item)
		}
		ran[item]++
		minRan = min(minRan, item)
	}
	for i := 0; i < 1000; i++ {
		if !done[i] && ran[i] != 1 {
			t.Fatalf("unfinished item %d ran %d times after the restart", i, ran[i])
		}
	}
	if minRan != firstUnfinished {
		t.Fatalf("resumed at item %d, the first unfinished is %d", minRan, firstUnfinished)
	}
	t.Logf("killed with %d of 1000 items checkpointed; resumed at item %d; %d items ran after the restart", len(done), firstUnfinished, len(ran))
}

// waitAllDone waits for the helper's "all-done" line and for its exit, within d; a
// helper that hangs is killed and the test fails with what it was waiting for.
func waitAllDone(t *testing.T, cmd *exec.Cmd, lines <-chan string, d time.Duration) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for done := false; !done; {
		select {
		case l, ok := <-lines:
			done = !ok || l == "all-done"
		case <-deadline.C:
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("the node did not print all-done within %s", d)
		}
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-deadline.C:
		_ = cmd.Process.Kill()
		<-exited
		t.Fatalf("the node printed all-done but did not exit within %s", d)
	}
}
