package engine

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/testkit/within"
)

type crashNode struct {
	t      *testing.T
	dir    string
	wfFile string
	runs   string
	record string

	mu  sync.Mutex
	out []string // every line the node printed, over all its starts
}

// start launches the node; lines of its output arrive on the returned channel (and in
// n.out), which is closed when the node's output ends.
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
			n.mu.Lock()
			n.out = append(n.out, sc.Text())
			n.mu.Unlock()
			lines <- sc.Text()
		}
	}()
	return cmd, lines
}

// kill SIGKILLs the node and returns once all it printed has been read.
func (n *crashNode) kill(t *testing.T, cmd *exec.Cmd, lines <-chan string) {
	t.Helper()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for open := true; open; { // the output ends with the process: nothing else holds the pipe
		select {
		case _, open = <-lines:
		case <-deadline.C:
			t.Fatal("the killed node's output did not end within 30s")
		}
	}
	_ = within.Cmd(t, 30*time.Second, cmd, "the killed node")
}

// printed reports whether the node has printed the line, in any of its starts.
func (n *crashNode) printed(line string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Contains(n.out, line)
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

// Crash resume: runs of 10 exec-like steps (each appends its name and epoch to a file,
// then works a while) in a node SIGKILLed at random points and restarted, 20 times. The
// file, not the store (which fences a second commit whatever the engine does), is the
// evidence: no step runs in an epoch after the one that checkpointed it; a step runs in
// an earlier epoch only if it was the one in flight at a kill, and then once more in the
// next epoch (its idempotency key is the same both times: it is the same (run, step,
// item)); no write is fenced (there is no zombie); each run changed epoch exactly once per
// kill that landed in it. Invariant 3 of DESIGN.md.
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
	type killLanding struct {
		run     string
		epoch   int64
		running bool // the run had not finished when the kill landed
	}
	var landed []killLanding
	finished := false
	for kill := 0; kill < 20 && !finished; kill++ {
		cmd, lines := node.start()
		before := len(recordLines(t, node.record))
		if !waitLines(t, node.record, before+rng.IntN(3), lines) {
			finished = true
		}
		node.kill(t, cmd, lines)
		killedAt = append(killedAt, len(recordLines(t, node.record)))
		// The run a kill landed in: the one whose step recorded the last side effect
		// before it, unless the node had already printed that the run was done (then
		// the kill landed between runs and changed no epoch).
		// (A kill stalled past the run's end and the next run's claim would land in an
		// unclaimed run, whose new epoch does not count; the kill follows the line by
		// milliseconds and the run needs 180 ms more to end.)
		if last := parseEffects(t, recordLines(t, node.record)); len(last) > 0 {
			in := last[len(last)-1]
			landed = append(landed, killLanding{epoch: in.Epoch, run: in.Run, running: !node.printed("done " + in.Run + " succeeded")})
		}
	}
	if len(killedAt) < 20 {
		t.Fatalf("the runs finished after %d kills; make them longer", len(killedAt))
	}
	cmd, lines := node.start()
	waitAllDone(t, cmd, lines, 2*time.Minute)
	got := parseEffects(t, recordLines(t, node.record))
	lastBeforeKill := map[int]bool{}
	for _, k := range killedAt {
		lastBeforeKill[k-1] = true
	}
	store, err := checkpoint.OpenStore(filepath.Join(node.dir, "state"), checkpoint.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	repeats, changes := 0, 0
	for _, id := range runs {
		v, err := store.View(id)
		if err != nil {
			t.Fatal(err)
		}
		if v.Run.Status != checkpoint.StatusSucceeded {
			t.Fatalf("%s: %s %s", id, v.Run.Status, v.Run.Error)
		}
		// (a), (b): a checkpointed step never runs in a later epoch; a step runs in an
		// epoch before its checkpoint's only if it wrote the last side effect before a kill
		// (in flight at the kill), and then again in the run's next epoch. The steps are in
		// one chain and the runs one after another, so at most one is in flight.
		repeats += checkResumed(t, v, got, func(e effect) bool { return lastBeforeKill[e.Line] })
		for i := 1; i <= 10; i++ {
			if _, ok := acceptedEpochs(t, v)[stepItem{fmt.Sprintf("s%02d", i), checkpoint.ItemWhole}]; !ok {
				t.Errorf("%s: s%02d has no checkpoint", id, i)
			}
		}
		// (c) a SIGKILLed node is dead: nothing of its epoch can be written late.
		checkNoFenced(t, v)
		// (d) one epoch change per kill that landed while the run was running, each
		// beginning the next epoch after the killed one; none other.
		var killedEpochs []int64
		for _, l := range landed {
			if l.run == id && l.running {
				killedEpochs = append(killedEpochs, l.epoch)
			}
		}
		var want []int64 // the run's epochs that were ended by a kill: all but the last
		for _, r := range v.Run.Epochs[:len(v.Run.Epochs)-1] {
			want = append(want, r.Epoch)
		}
		if v.Run.EpochChanges != len(killedEpochs) || !slices.Equal(killedEpochs, want) {
			t.Errorf("%s: %d epoch changes, epochs %+v; kills landed in its epochs %v", id, v.Run.EpochChanges, v.Run.Epochs, killedEpochs)
		}
		for i, r := range v.Run.Epochs {
			if (i == 0) != (r.Reason == checkpoint.ReasonAssigned) || (i > 0 && r.Reason != checkpoint.ReasonLeaseExpired && r.Reason != checkpoint.ReasonReconciled) {
				t.Errorf("%s: epoch %d began for %q", id, r.Epoch, r.Reason)
			}
		}
		changes += v.Run.EpochChanges
	}
	if t.Failed() {
		t.FailNow()
	}
	if repeats == 0 {
		t.Fatalf("no kill landed inside a step: the test did not exercise the in-flight case")
	}
	t.Logf("20 kills over %d runs: %d epoch changes; %d side effects, %d repeated (each in flight at a kill)", len(runs), changes, len(got), repeats)
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
	node.kill(t, cmd, lines)
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
	// One kill, while the run was running (400 of 1000 items recorded): one counted epoch
	// change, and no fenced write (the killed node is dead).
	if v.Run.Status != checkpoint.StatusSucceeded || len(v.Run.Epochs) != 2 || v.Run.EpochChanges != 1 {
		t.Fatalf("run %s epochs %+v changes %d", v.Run.Status, v.Run.Epochs, v.Run.EpochChanges)
	}
	checkNoFenced(t, v)
	killedEpoch := v.Run.Epochs[0].Epoch
	// No item checkpointed in an epoch runs in a later one; the items that ran in the
	// killed epoch and were checkpointed in the next are those in flight at the kill: at
	// most the parallelism, 4, since an item holds its slot until its commit's outcome.
	repeats := checkResumed(t, v, parseEffects(t, recordLines(t, node.record)), func(e effect) bool { return e.Epoch == killedEpoch })
	if repeats > 4 {
		t.Errorf("%d items ran in the killed epoch and again in the next; at most the 4 in flight may", repeats)
	}
	if t.Failed() {
		t.FailNow()
	}
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
	after := parseEffects(t, recordLines(t, node.record)[atKill:])
	ran := map[int]int{}
	minRan := 1 << 30
	for _, e := range after {
		if e.Step != "each" {
			continue
		}
		if done[e.Item] {
			t.Fatalf("item %d ran again after the restart although it was checkpointed", e.Item)
		}
		ran[e.Item]++
		minRan = min(minRan, e.Item)
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
			_ = within.Cmd(t, 30*time.Second, cmd, "the node killed at its deadline")
			t.Fatalf("the node did not print all-done within %s", d)
		}
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-deadline.C:
		_ = cmd.Process.Kill()
		within.Recv(t, 30*time.Second, exited, "the node killed at its deadline to exit")
		t.Fatalf("the node printed all-done but did not exit within %s", d)
	}
}
