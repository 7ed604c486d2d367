package logstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/port"
	"github.com/flowrun/flow/internal/testkit/within"
)

func TestLogWriteAwaitAndFence(t *testing.T) {
	env := startEnv(t, t.TempDir())
	ctx := ctxT(t)
	l := env.log.Writer
	if _, err := write(ctx, l, submitEntry("r1", checkpoint.StepSpec{Name: "one"})); err != nil {
		t.Fatal(err)
	}
	old, err := write(ctx, l, checkpoint.Entry{Kind: checkpoint.KindAssign, Run: "r1", Term: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := write(ctx, l, checkpoint.Entry{Kind: checkpoint.KindClaim, Run: "r1", Epoch: int64(old), Owner: "a"}); err != nil {
		t.Fatal(err)
	}
	cur, err := write(ctx, l, checkpoint.Entry{Kind: checkpoint.KindAssign, Run: "r1", Epoch: int64(old), Term: 1, Reason: checkpoint.ReasonLeaseExpired})
	if err != nil || cur <= old {
		t.Fatalf("reassign: seq %d err %v", cur, err)
	}
	if _, err := write(ctx, l, checkpoint.Entry{Kind: checkpoint.KindClaim, Run: "r1", Epoch: int64(cur), Owner: "b"}); err != nil {
		t.Fatal(err)
	}
	_, err = write(ctx, l, checkpoint.Entry{Kind: checkpoint.KindCommit, Run: "r1", Step: "one", Item: checkpoint.ItemWhole, Epoch: int64(old), Owner: "a", Output: json.RawMessage(`{}`)})
	var fe *checkpoint.FencedError
	if !errors.As(err, &fe) || !errors.Is(err, checkpoint.ErrFenced) || fe.Epoch != int64(old) || fe.CurrentEpoch != int64(cur) {
		t.Fatalf("zombie commit through the log: %v; want ErrFenced with epochs %d and %d", err, old, cur)
	}
	if _, err := write(ctx, l, checkpoint.Entry{Kind: checkpoint.KindCommit, Run: "r1", Step: "one", Item: checkpoint.ItemWhole, Epoch: int64(cur), Owner: "b", Output: json.RawMessage(`{"ok":true}`)}); err != nil {
		t.Fatal(err)
	}
	last, err := env.log.Applier.LastSeq(ctx)
	if err != nil || last != env.store.Applied() {
		t.Fatalf("last seq %d applied %d err %v", last, env.store.Applied(), err)
	}
}

func TestLogRefusesBadEntriesBeforePublishing(t *testing.T) {
	env := startEnv(t, t.TempDir())
	ctx := ctxT(t)
	w := env.log.Writer
	big := json.RawMessage(`"` + strings.Repeat("x", DefaultMaxOutputBytes) + `"`)
	f := w.Write(ctx, checkpoint.Entry{Kind: checkpoint.KindCommit, Run: "r1", Step: "one", Item: checkpoint.ItemWhole, Epoch: 5, Owner: "a", Output: big})
	if err := f.Await(ctx); !errors.Is(err, ErrOutputTooLarge) || !strings.Contains(err.Error(), "limit is 1048576") || f.Seq() != 0 {
		t.Fatalf("oversized output: %v (seq %d)", err, f.Seq())
	}
	if err := w.Write(ctx, checkpoint.Entry{Kind: checkpoint.KindCommit, Run: "r1", Step: "one", Item: checkpoint.ItemWhole, Owner: "a"}).Await(ctx); !errors.Is(err, checkpoint.ErrInvalidEntry) {
		t.Fatalf("commit without epoch: %v", err)
	}
	// One bad entry refuses the whole write: every entry's outcome is the refusal.
	errs := w.Write(ctx, submitEntry("r2", checkpoint.StepSpec{Name: "one"}), checkpoint.Entry{Kind: checkpoint.KindClaim, Run: "r2"}).Results(ctx)
	if len(errs) != 2 || !errors.Is(errs[0], checkpoint.ErrInvalidEntry) || !errors.Is(errs[1], checkpoint.ErrInvalidEntry) {
		t.Fatalf("a write with an invalid entry: %v", errs)
	}
	if err := w.Write(ctx).Await(ctx); !errors.Is(err, checkpoint.ErrInvalidEntry) {
		t.Fatalf("a write of no entries: %v", err)
	}
	many := make([]checkpoint.Entry, DefaultMaxBatchEntries+1)
	for i := range many {
		many[i] = submitEntry(fmt.Sprintf("m%d", i), checkpoint.StepSpec{Name: "one"})
	}
	if err := w.Write(ctx, many...).Await(ctx); !errors.Is(err, checkpoint.ErrInvalidEntry) || !strings.Contains(err.Error(), "at most 256") {
		t.Fatalf("a write of more entries than a message holds: %v", err)
	}
	last, err := env.log.Applier.LastSeq(ctx)
	if err != nil || last != 0 {
		t.Fatalf("refused entries reached the log: last seq %d (%v)", last, err)
	}
}

// Restart: a node that stops and starts again replays from its applied sequence, and a
// node with an empty state replays the whole log into the same state.
func TestLogReplayAfterRestart(t *testing.T) {
	dir := t.TempDir()
	env := startEnv(t, dir)
	ctx := ctxT(t)
	writeRuns := func(from, to int) {
		for i := from; i < to; i++ {
			id := fmt.Sprintf("r%d", i)
			if _, err := write(ctx, env.log.Writer, submitEntry(id, checkpoint.StepSpec{Name: "one"})); err != nil {
				t.Fatal(err)
			}
			if _, err := write(ctx, env.log.Writer, checkpoint.Entry{Kind: checkpoint.KindAssign, Run: id, Term: 1}); err != nil {
				t.Fatal(err)
			}
		}
	}
	writeRuns(0, 20)
	env.closeLog()
	env.openLog(t)
	if env.store.Applied() != 40 {
		t.Fatalf("reopened state applied %d, want 40", env.store.Applied())
	}
	writeRuns(20, 25)
	var before bytes.Buffer
	if err := env.store.Dump(&before); err != nil {
		t.Fatal(err)
	}
	// A fresh node: no state at all, the same log.
	fresh := memStore(t)
	l2, err := Open(testConfig(env.js, fresh, "node-b"))
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer l2.Stop()
	if err := l2.Applier.WaitApplied(ctx, 50); err != nil {
		t.Fatal(err)
	}
	var after bytes.Buffer
	if err := fresh.Dump(&after); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before.Bytes(), after.Bytes()) {
		t.Fatalf("a fresh replay differs from the node that wrote the log")
	}
}

// Group commit: concurrent writers share log messages, and every writer gets its own
// entry's outcome.
func TestLogGroupCommit(t *testing.T) {
	env := startEnv(t, t.TempDir())
	ctx := ctxT(t)
	const writers, each = 32, 20
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				id := fmt.Sprintf("w%d-%d", w, i)
				if _, err := write(ctx, env.log.Writer, submitEntry(id, checkpoint.StepSpec{Name: "one"})); err != nil {
					errs <- err
				}
				// every second submit is repeated: that writer must get ErrRunExists
				if i%2 == 0 {
					if _, err := write(ctx, env.log.Writer, submitEntry(id, checkpoint.StepSpec{Name: "one"})); !errors.Is(err, checkpoint.ErrRunExists) {
						errs <- fmt.Errorf("repeated submit %s: %v", id, err)
					}
				}
			}
		}(w)
	}
	within.Group(t, 30*time.Second, &wg, "the writers")
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	runs, _, err := env.store.ListRuns(checkpoint.ListOptions{Limit: 10000})
	if err != nil || len(runs) != writers*each {
		t.Fatalf("runs %d (%v), want %d", len(runs), err, writers*each)
	}
	entries := writers * each * 3 / 2
	if msgs := env.store.Applied(); msgs >= uint64(entries) {
		t.Fatalf("%d entries took %d messages: no group commit", entries, msgs)
	} else {
		t.Logf("%d entries in %d messages", entries, msgs)
	}
}

func TestLogStopIsSafe(t *testing.T) {
	env := startEnv(t, t.TempDir())
	ctx := ctxT(t)
	unstarted, err := Open(testConfig(env.js, memStore(t), "x"))
	if err != nil {
		t.Fatal(err)
	}
	unstarted.Writer.Stop()
	unstarted.Writer.Stop()
	unstarted.Applier.Stop()
	unstarted.Stop()
	if err := unstarted.Start(ctx); !errors.Is(err, ErrStopped) {
		t.Fatalf("start after a stop before start: %v", err)
	}
	env.log.Stop()
	env.log.Stop()
	if err := env.log.Writer.Write(ctx, submitEntry("late", checkpoint.StepSpec{Name: "one"})).Await(ctx); !errors.Is(err, ErrStopped) {
		t.Fatalf("write after stop: %v", err)
	}
	if err := env.log.Start(ctx); !errors.Is(err, ErrStopped) {
		t.Fatalf("start after stop: %v", err)
	}
	if err := env.log.Writer.Start(ctx); !errors.Is(err, ErrStopped) {
		t.Fatalf("writer start after stop: %v", err)
	}
}

// The writer and the applier started and stopped in every order, concurrently: Stop
// returns only when the part's goroutines have ended (goleak checks at the end), a
// Start that comes after Stop fails with ErrStopped, and a write queued before Start
// gets an outcome either way.
func TestStartStopStress(t *testing.T) {
	env := startEnv(t, t.TempDir())
	ctx := ctxT(t)
	rng := rand.New(rand.NewPCG(3, 9))
	for round := range 20 {
		l, err := Open(testConfig(env.js, memStore(t), "stress"))
		if err != nil {
			t.Fatal(err)
		}
		early := l.Writer.Write(ctx, submitEntry(fmt.Sprintf("early-%d", round), checkpoint.StepSpec{Name: "one"}))
		ops := []func(){
			func() { _ = l.Applier.Start(ctx) },
			func() { _ = l.Writer.Start(ctx) },
			func() { _ = l.Start(ctx) },
			l.Writer.Stop,
			l.Applier.Stop,
			l.Stop,
		}
		var wg sync.WaitGroup
		for _, i := range rng.Perm(len(ops)) {
			wg.Add(1)
			go func() { defer wg.Done(); ops[i]() }()
		}
		within.Group(t, 30*time.Second, &wg, fmt.Sprintf("round %d's starts and stops", round))
		l.Stop()
		if err := l.Start(ctx); !errors.Is(err, ErrStopped) {
			t.Fatalf("round %d: start after stop: %v", round, err)
		}
		// Published and applied before the stop, or stopped: never left waiting.
		if err := early.Await(ctx); err != nil && !errors.Is(err, ErrStopped) && !errors.Is(err, ErrAppendUncertain) {
			t.Fatalf("round %d: a write queued before start: %v", round, err)
		}
	}
}

// A message of a newer format version in the stream stops the applier with an error
// naming its sequence and saying to upgrade, and nothing after it is applied.
func TestApplierStopsOnANewerFormat(t *testing.T) {
	env := startEnv(t, t.TempDir())
	ctx := ctxT(t)
	if _, err := write(ctx, env.log.Writer, submitEntry("r1", checkpoint.StepSpec{Name: "one"})); err != nil {
		t.Fatal(err)
	}
	if _, err := env.js.Publish(ctx, port.LogSubject, []byte(`{"v":9,"entries":[]}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-env.log.Applier.Failed():
	case <-ctx.Done():
		t.Fatal("applier did not stop on a message of a newer format")
	}
	if err := env.log.Applier.Err(); !errors.Is(err, checkpoint.ErrNewerFormat) || !strings.Contains(err.Error(), "sequence 2") || !strings.Contains(err.Error(), "revision 9") {
		t.Fatalf("applier error = %v; want ErrNewerFormat at sequence 2", err)
	}
	if _, err := write(ctx, env.log.Writer, submitEntry("r2", checkpoint.StepSpec{Name: "one"})); err == nil {
		t.Fatal("a write after the applier stopped succeeded")
	}
	if env.store.Applied() != 1 {
		t.Fatalf("applied %d, want 1", env.store.Applied())
	}
}

// One Write's entries share one message whatever other writers do meanwhile, each gets
// its own outcome, and a write too big for one message is refused before publishing.
func TestWriteSharesOneMessage(t *testing.T) {
	env := startEnv(t, t.TempDir())
	ctx := ctxT(t)
	l := env.log.Writer
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() { // other writers keep the queue busy
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = write(ctx, l, submitEntry(fmt.Sprintf("noise-%d", i), checkpoint.StepSpec{Name: "one"}))
		}
	}()
	for i := 0; i < 30; i++ {
		id := fmt.Sprintf("g%d", i)
		f := l.Write(ctx, submitEntry(id, checkpoint.StepSpec{Name: "one"}), checkpoint.Entry{Kind: checkpoint.KindAssign, Run: id, Term: 1})
		if err := f.Await(ctx); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		v, err := env.store.View(id)
		if err != nil {
			t.Fatal(err)
		}
		if len(v.Events) == 0 || v.Events[0].Seq != f.Seq() || v.Run.Epoch != int64(f.Seq()) {
			t.Fatalf("%s: written in message %d, epoch %d (%v): want the submit and the assign in one message", id, f.Seq(), v.Run.Epoch, err)
		}
	}
	close(stop)
	within.Group(t, 30*time.Second, &wg, "the noise writer")

	// Each entry is judged on its own: a fenced commit, then a completion that needs it.
	old := int64(0)
	if r, err := env.store.Run("g0"); err == nil {
		old = r.Epoch
	}
	if _, err := write(ctx, l, checkpoint.Entry{Kind: checkpoint.KindClaim, Run: "g0", Epoch: old, Owner: "a"}); err != nil {
		t.Fatal(err)
	}
	cur, err := write(ctx, l, checkpoint.Entry{Kind: checkpoint.KindAssign, Run: "g0", Epoch: old, Term: 1, Reason: checkpoint.ReasonLeaseExpired})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := write(ctx, l, checkpoint.Entry{Kind: checkpoint.KindClaim, Run: "g0", Epoch: int64(cur), Owner: "b"}); err != nil {
		t.Fatal(err)
	}
	f := l.Write(ctx, checkpoint.Entry{Kind: checkpoint.KindCommit, Run: "g0", Step: "one", Item: checkpoint.ItemWhole, Epoch: old, Owner: "a", Output: json.RawMessage(`{}`)},
		checkpoint.Entry{Kind: checkpoint.KindComplete, Run: "g0", Epoch: int64(cur), Owner: "b", Status: checkpoint.StatusSucceeded})
	errs := f.Results(ctx)
	if !errors.Is(errs[0], checkpoint.ErrFenced) {
		t.Fatalf("stale commit in a write: %v, want ErrFenced", errs[0])
	}
	if !errors.Is(errs[1], checkpoint.ErrConflict) {
		t.Fatalf("completion after a fenced commit: %v, want a conflict (step one never succeeded)", errs[1])
	}
	if err := f.Await(ctx); !errors.Is(err, checkpoint.ErrFenced) || f.Seq() <= uint64(cur) {
		t.Fatalf("the write's Await: %v at %d, want the first rejection (ErrFenced) after %d", err, f.Seq(), cur)
	}

	before, _ := env.log.Applier.LastSeq(ctx)
	half := json.RawMessage(`"` + strings.Repeat("x", DefaultMaxOutputBytes-100) + `"`)
	var group []checkpoint.Entry
	for i := 0; i < 10; i++ {
		group = append(group, checkpoint.Entry{Kind: checkpoint.KindCommit, Run: "g1", Step: "one", Item: i, Epoch: 5, Owner: "a", Output: half})
	}
	if err := l.Write(ctx, group...).Await(ctx); !errors.Is(err, ErrOutputTooLarge) {
		t.Fatalf("10 MiB in one write: %v, want ErrOutputTooLarge", err)
	}
	if after, _ := env.log.Applier.LastSeq(ctx); after != before {
		t.Fatalf("a refused write reached the log")
	}
}

// Two nodes writing at once: each applies its own messages from the publish ack when
// they are next (applyOwn) and leaves the rest to its applier; both end in the same
// state, equal to a replay by a third node that wrote nothing, and every writer got the
// outcome the log's order implies (half the submits are repeats: ErrRunExists).
func TestOwnApplyAgreesWithTheLog(t *testing.T) {
	env := startEnv(t, t.TempDir())
	ctx := ctxT(t)
	open := func(node string) (*Log, *checkpoint.Store) {
		s := memStore(t)
		l, err := Open(testConfig(env.js, s, node))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Stop)
		return l, s
	}
	la, sa := env.log, env.store
	lb, sb := open("node-b")
	var wg sync.WaitGroup
	errs := make(chan error, 400)
	for w, l := range []*Log{la, lb, la, lb} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				id := fmt.Sprintf("r%d", i) // all four writers submit the same runs
				_, err := write(ctx, l.Writer, submitEntry(id, checkpoint.StepSpec{Name: "one"}))
				if err != nil && !errors.Is(err, checkpoint.ErrRunExists) {
					errs <- fmt.Errorf("writer %d: %v", w, err)
				}
				if err == nil {
					errs <- nil // a first submit
				}
			}
		}()
	}
	within.Group(t, 30*time.Second, &wg, "the four writers")
	close(errs)
	firsts := 0
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
		firsts++
	}
	if firsts != 50 {
		t.Fatalf("%d submits accepted for 50 runs: a run was created twice or never", firsts)
	}
	last, err := la.Applier.LastSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lc, sc := open("node-c")
	for _, l := range []*Log{la, lb, lc} {
		if err := l.Applier.WaitApplied(ctx, last); err != nil {
			t.Fatal(err)
		}
	}
	var dumps []string
	for _, s := range []*checkpoint.Store{sa, sb, sc} {
		var b bytes.Buffer
		if err := s.Dump(&b); err != nil {
			t.Fatal(err)
		}
		dumps = append(dumps, b.String())
	}
	if dumps[0] != dumps[1] || dumps[1] != dumps[2] {
		t.Fatalf("the writers' states differ from each other or from a replay")
	}
}

// An applier whose consumer went silent is replaced by its supervisor once it has
// neither applied a message nor seen itself caught up for StallTimeout; with the
// silence allowed an hour the node stays behind: the control shows the supervision is
// what recovers it.
func TestStalledApplierIsRestarted(t *testing.T) {
	env := startEnv(t, t.TempDir())
	ctx := ctxT(t)
	for _, c := range []struct {
		stall    time.Duration
		recovers bool
	}{{300 * time.Millisecond, true}, {time.Hour, false}} {
		store := memStore(t)
		watched, err := Open(testConfig(env.js, store, "watched", func(cfg *Config) { cfg.StallTimeout = c.stall }))
		if err != nil {
			t.Fatal(err)
		}
		if err := watched.Start(ctx); err != nil {
			t.Fatal(err)
		}
		// A message the watched node applies: its consumer is running (it clears the
		// switch below when it starts) before the switch is set.
		last, err := write(ctx, env.log.Writer, submitEntry(fmt.Sprintf("before-stall-%v", c.recovers), checkpoint.StepSpec{Name: "one"}))
		if err != nil {
			t.Fatal(err)
		}
		if err := watched.Applier.WaitApplied(ctx, last); err != nil {
			t.Fatal(err)
		}
		// The consumer goes silent (as a consumer stuck on a lost server does, or one
		// behind a silent partition: no error, nothing heard), and another node writes.
		watched.Applier.hooks.Deaf.Store(true)
		seq, err := write(ctx, env.log.Writer, submitEntry(fmt.Sprintf("after-stall-%v", c.recovers), checkpoint.StepSpec{Name: "one"}))
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = watched.Applier.WaitApplied(wctx, seq)
		cancel()
		if c.recovers && (err != nil || watched.Applier.ConsumerRestarts() == 0) {
			t.Fatalf("stalled applier not recovered: %v (restarts %d)", err, watched.Applier.ConsumerRestarts())
		}
		if !c.recovers && err == nil {
			t.Fatal("the applier caught up without its supervisor: the test does not stall it")
		}
		watched.Stop()
	}
}

// Each writer's entries reach the log in the order it wrote them, whichever way it
// writes (one entry or several per Write, awaited or not, notes) and whether its write
// was published inline (the log idle) or by the group commit: writers racing for the
// idle log must never let a later entry pass an earlier one still queued. With the
// inline path allowed past queued writes (control, Hooks.PassQueue), the same workload
// sees it. Both sides run orderRounds rounds: the guard none with a reorder, the
// control at least one (measured under -race on two cores: a reorder in every round,
// from the lone writer's pairs).
func TestWritersKeepTheirOrder(t *testing.T) {
	for _, pass := range []bool{false, true} {
		t.Run(map[bool]string{false: "in-order", true: "control-pass-queue"}[pass], func(t *testing.T) {
			seen := 0
			for round := range orderRounds {
				v := writeInOrder(t, pass)
				if v == "" {
					continue
				}
				if !pass {
					t.Fatalf("round %d: %s", round, v)
				}
				seen++
				t.Logf("round %d: %s", round, v)
			}
			if pass && seen == 0 {
				t.Fatalf("with the inline path allowed past queued writes no reorder was seen in %d rounds: the control cannot see the guard", orderRounds)
			}
			if pass {
				t.Logf("the control saw a reorder in %d of %d rounds", seen, orderRounds)
			}
		})
	}
}

// orderRounds is how many rounds each side of TestWritersKeepTheirOrder runs.
const orderRounds = 3

// writeInOrder runs the workload and returns the first reorder it finds, or "".
func writeInOrder(t *testing.T, passQueue bool) string {
	t.Helper()
	env := startEnv(t, t.TempDir())
	defer env.close()
	env.log.Writer.hooks.PassQueue = passQueue
	ctx := ctxT(t)
	const writers, calls = 6, 60
	var wg sync.WaitGroup
	// order[w] lists writer w's entries as written: a run ID for a submit, or
	// "note:<n>" for its n-th note, a step start of its run "w<w>-notes" (fenced, as the
	// run is not running, and recorded in its history with the item n). The last is
	// the lone writer's, below.
	order := make([][]string, writers+1)
	for w := range writers {
		if _, err := write(ctx, env.log.Writer, submitEntry(fmt.Sprintf("w%d-notes", w), checkpoint.StepSpec{Name: "one"})); err != nil {
			t.Fatal(err)
		}
	}
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var pending []*Future
			notes := 0
			for i := range calls {
				n := 1 + rng.IntN(3)/2 // one entry, or two a third of the time
				es := make([]checkpoint.Entry, n)
				mode := rng.IntN(5)
				for j := range es {
					if mode == 4 {
						es[j] = checkpoint.Entry{Kind: checkpoint.KindStart, Run: fmt.Sprintf("w%d-notes", w), Step: "one", Item: notes, Epoch: 1, Owner: "w"}
						order[w] = append(order[w], fmt.Sprintf("note:%d", notes))
						notes++
						continue
					}
					id := fmt.Sprintf("w%d-%d-%d", w, i, j)
					es[j] = submitEntry(id, checkpoint.StepSpec{Name: "one"})
					order[w] = append(order[w], id)
				}
				var err error
				switch mode {
				case 4: // notes, one Write each, not awaited
					for _, e := range es {
						pending = append(pending, env.log.Writer.Write(ctx, e))
					}
				case 0: // not awaited, and queued for the group commit: a deadline before
					// PublishTimeout keeps a write off the inline path
					qctx, cancel := context.WithTimeout(ctx, DefaultPublishTimeout/2)
					pending = append(pending, env.log.Writer.Write(qctx, es...))
					cancel()
				case 1, 2: // one message, awaited
					err = env.log.Writer.Write(ctx, es...).Await(ctx)
				default: // one Write per entry, each awaited
					for _, e := range es {
						if err = env.log.Writer.Write(ctx, e).Await(ctx); err != nil {
							break
						}
					}
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
			for _, f := range pending {
				if err := f.Await(ctx); err != nil && !errors.Is(err, checkpoint.ErrFenced) {
					t.Error(err)
				}
			}
		}()
	}
	within.Group(t, 30*time.Second, &wg, "the writers") // each call has ctx's deadline
	// A lone writer: a write queued for the group commit (not awaited), then at once an
	// awaited one. With nobody else writing the second finds the log idle, and only the
	// queued write keeps it from going inline ahead of the first: the case the guard is
	// for, made as likely as it can be.
	lone := writers
	for i := range lonePairs {
		first, second := fmt.Sprintf("w%d-%d-q", lone, i), fmt.Sprintf("w%d-%d-i", lone, i)
		qctx, cancel := context.WithTimeout(ctx, DefaultPublishTimeout/2)
		queued := env.log.Writer.Write(qctx, submitEntry(first, checkpoint.StepSpec{Name: "one"}))
		cancel()
		if err := env.log.Writer.Write(ctx, submitEntry(second, checkpoint.StepSpec{Name: "one"})).Await(ctx); err != nil {
			t.Fatal(err)
		}
		if err := queued.Await(ctx); err != nil {
			t.Fatal(err)
		}
		order[lone] = append(order[lone], first, second)
	}
	for w, keys := range order {
		if v := writerOrder(t, env.store, w, keys); v != "" {
			return v
		}
	}
	return ""
}

// lonePairs is how many pairs of writes writeInOrder's lone writer makes.
const lonePairs = 20

// writerOrder returns the first of writer w's keys (writeInOrder's order[w]) that the
// log holds before the key written before it, or "".
func writerOrder(t *testing.T, store *checkpoint.Store, w int, keys []string) string {
	t.Helper()
	type pos struct{ seq, idx uint64 }
	noteAt := map[int]pos{}
	if notes, err := store.View(fmt.Sprintf("w%d-notes", w)); err == nil {
		for _, ev := range notes.Events {
			if ev.Kind == checkpoint.KindStart {
				noteAt[ev.Item] = pos{ev.Seq, uint64(ev.Index)}
			}
		}
	}
	var last pos
	for i, key := range keys {
		var p pos
		if n, ok := strings.CutPrefix(key, "note:"); ok {
			k, _ := strconv.Atoi(n)
			at, found := noteAt[k]
			if !found {
				t.Fatalf("writer %d: note %d is not in the log", w, k)
			}
			p = at
		} else {
			v, err := store.View(key)
			if err != nil || len(v.Events) == 0 {
				t.Fatalf("run %s: %v", key, err)
			}
			p = pos{v.Events[0].Seq, uint64(v.Events[0].Index)}
		}
		if i > 0 && (p.seq < last.seq || (p.seq == last.seq && p.idx <= last.idx)) {
			return fmt.Sprintf("writer %d: %s at %d/%d came after %s at %d/%d in the log", w, key, p.seq, p.idx, keys[i-1], last.seq, last.idx)
		}
		last = p
	}
	return ""
}

// A note (a Write of step starts or non-final failures only) rides with the next write:
// a lone writer's note and write cost one message. A note with no write after it is
// still published, within NoteDelay. A write that holds a start among other entries is
// no note: it goes out at once.
func TestNotesRideWithTheNextWrite(t *testing.T) {
	env := startEnv(t, t.TempDir())
	ctx := ctxT(t)
	// A note delay far longer than a write takes, so that the rounds do not depend on
	// the machine's speed (under -race on a loaded machine a write came after 5ms).
	store := memStore(t)
	patient, err := Open(testConfig(env.js, store, "patient", func(c *Config) { c.NoteDelay = time.Minute }))
	if err != nil {
		t.Fatal(err)
	}
	if err := patient.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer patient.Stop()
	w := patient.Writer
	// A running run whose step the notes start (and fail, to be retried).
	if _, err := write(ctx, w, submitEntry("noted", checkpoint.StepSpec{Name: "one"})); err != nil {
		t.Fatal(err)
	}
	ep, err := write(ctx, w, checkpoint.Entry{Kind: checkpoint.KindAssign, Run: "noted", Term: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := write(ctx, w, checkpoint.Entry{Kind: checkpoint.KindClaim, Run: "noted", Epoch: int64(ep), Owner: "a"}); err != nil {
		t.Fatal(err)
	}
	start := checkpoint.Entry{Kind: checkpoint.KindStart, Run: "noted", Step: "one", Item: checkpoint.ItemWhole, Epoch: int64(ep), Owner: "a"}
	retry := checkpoint.Entry{Kind: checkpoint.KindFail, Run: "noted", Step: "one", Item: checkpoint.ItemWhole, Epoch: int64(ep), Owner: "a", Error: "try again"}
	for i := range 20 {
		noted := start
		if i%2 == 1 {
			noted = retry
		}
		note := w.Write(ctx, noted)
		f := w.Write(ctx, submitEntry(fmt.Sprintf("w%d", i), checkpoint.StepSpec{Name: "one"}))
		if err := f.Await(ctx); err != nil {
			t.Fatal(err)
		}
		if err := note.Await(ctx); err != nil {
			t.Fatal(err)
		}
		if note.Seq() != f.Seq() {
			t.Fatalf("round %d: the note went out in message %d, the write in %d: want one message", i, note.Seq(), f.Seq())
		}
	}
	// A start with a write that waits is no note: it goes out now, not after a minute.
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := w.Write(sctx, start, submitEntry("with-a-start", checkpoint.StepSpec{Name: "one"})).Await(sctx); err != nil {
		t.Fatalf("a start written with a submit: %v", err)
	}
	alone := env.log.Writer.Write(ctx, checkpoint.Entry{Kind: checkpoint.KindStart, Run: "noted", Step: "one", Item: checkpoint.ItemWhole, Epoch: 1, Owner: "a"})
	if err := alone.Await(ctx); alone.Seq() == 0 { // ctxT's deadline bounds the wait
		t.Fatalf("a note with nothing after it: %v", err)
	}
}

// A write whose caller's deadline comes before the publish timeout keeps that deadline:
// it is not published on the caller's goroutine (which runs a publish to its end, up to
// PublishTimeout) but by the writer, and the caller returns at its deadline even when
// the log cannot be reached.
func TestWriteKeepsItsCallersDeadline(t *testing.T) {
	env := startEnv(t, t.TempDir())
	env.srv.Shutdown() // the log is unreachable: a publish waits out its timeout
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	began := time.Now()
	_, err := write(ctx, env.log.Writer, submitEntry("r1", checkpoint.StepSpec{Name: "a"}))
	took := time.Since(began)
	if err == nil {
		t.Fatal("a write to an unreachable log succeeded")
	}
	if took >= DefaultPublishTimeout/2 {
		t.Fatalf("the write returned after %s (%v): it waited out the publish, not its caller's 200ms deadline", took, err)
	}
}
