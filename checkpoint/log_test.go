package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
)

func TestLogWriteAwaitAndFence(t *testing.T) {
	env := startEnv(t, t.TempDir())
	ctx := ctxT(t)
	l := env.log
	if _, err := l.Write(ctx, submitEntry("r1", StepSpec{Name: "one"})); err != nil {
		t.Fatal(err)
	}
	old, err := l.Write(ctx, Entry{Kind: KindAssign, Run: "r1", Term: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Write(ctx, Entry{Kind: KindClaim, Run: "r1", Epoch: int64(old), Owner: "a"}); err != nil {
		t.Fatal(err)
	}
	cur, err := l.Write(ctx, Entry{Kind: KindAssign, Run: "r1", Epoch: int64(old), Term: 1, Reason: ReasonLeaseExpired})
	if err != nil || cur <= old {
		t.Fatalf("reassign: seq %d err %v", cur, err)
	}
	if _, err := l.Write(ctx, Entry{Kind: KindClaim, Run: "r1", Epoch: int64(cur), Owner: "b"}); err != nil {
		t.Fatal(err)
	}
	_, err = l.Write(ctx, Entry{Kind: KindCommit, Run: "r1", Step: "one", Item: ItemWhole, Epoch: int64(old), Owner: "a", Output: json.RawMessage(`{}`)})
	var fe *FencedError
	if !errors.As(err, &fe) || !errors.Is(err, ErrFenced) || fe.Epoch != int64(old) || fe.CurrentEpoch != int64(cur) {
		t.Fatalf("zombie commit through the log: %v; want ErrFenced with epochs %d and %d", err, old, cur)
	}
	if _, err := l.Write(ctx, Entry{Kind: KindCommit, Run: "r1", Step: "one", Item: ItemWhole, Epoch: int64(cur), Owner: "b", Output: json.RawMessage(`{"ok":true}`)}); err != nil {
		t.Fatal(err)
	}
	last, err := l.LastSeq(ctx)
	if err != nil || last != env.store.Applied() {
		t.Fatalf("last seq %d applied %d err %v", last, env.store.Applied(), err)
	}
}

func TestLogRefusesBadEntriesBeforePublishing(t *testing.T) {
	env := startEnv(t, t.TempDir())
	ctx := ctxT(t)
	big := json.RawMessage(`"` + strings.Repeat("x", DefaultMaxOutputBytes) + `"`)
	_, err := env.log.Append(ctx, Entry{Kind: KindCommit, Run: "r1", Step: "one", Item: ItemWhole, Epoch: 5, Owner: "a", Output: big})
	if !errors.Is(err, ErrOutputTooLarge) || !strings.Contains(err.Error(), "limit is 1048576") {
		t.Fatalf("oversized output: %v", err)
	}
	if _, err := env.log.Append(ctx, Entry{Kind: KindCommit, Run: "r1", Step: "one", Item: ItemWhole, Owner: "a"}); !errors.Is(err, ErrInvalidEntry) {
		t.Fatalf("commit without epoch: %v", err)
	}
	last, err := env.log.LastSeq(ctx)
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
			if _, err := env.log.Write(ctx, submitEntry(id, StepSpec{Name: "one"})); err != nil {
				t.Fatal(err)
			}
			if _, err := env.log.Write(ctx, Entry{Kind: KindAssign, Run: id, Term: 1}); err != nil {
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
	fresh := memStore(t, Unsafe{})
	l2, err := OpenLog(ctx, LogConfig{JS: env.js, Store: fresh, Node: "node-b"})
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer l2.Stop()
	if err := l2.WaitApplied(ctx, 50); err != nil {
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
				if _, err := env.log.Write(ctx, submitEntry(id, StepSpec{Name: "one"})); err != nil {
					errs <- err
				}
				// every second submit is repeated: that writer must get ErrRunExists
				if i%2 == 0 {
					if _, err := env.log.Write(ctx, submitEntry(id, StepSpec{Name: "one"})); !errors.Is(err, ErrRunExists) {
						errs <- fmt.Errorf("repeated submit %s: %v", id, err)
					}
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	runs, _, err := env.store.ListRuns(ListOptions{Limit: 10000})
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
	unstarted, err := OpenLog(ctx, LogConfig{JS: env.js, Store: memStore(t, Unsafe{}), Node: "x"})
	if err != nil {
		t.Fatal(err)
	}
	unstarted.Stop()
	unstarted.Stop()
	env.log.Stop()
	env.log.Stop()
	if _, err := env.log.Append(ctx, submitEntry("late", StepSpec{Name: "one"})); !errors.Is(err, ErrStopped) {
		t.Fatalf("append after stop: %v", err)
	}
	if err := env.log.Start(ctx); !errors.Is(err, ErrStopped) {
		t.Fatalf("start after stop: %v", err)
	}
	_ = context.Background()
}

// A corrupt message in the stream stops the applier with an error naming its sequence,
// and nothing after it is applied.
func TestApplierStopsOnCorruptMessage(t *testing.T) {
	env := startEnv(t, t.TempDir())
	ctx := ctxT(t)
	if _, err := env.log.Write(ctx, submitEntry("r1", StepSpec{Name: "one"})); err != nil {
		t.Fatal(err)
	}
	if _, err := env.js.Publish(ctx, DefaultSubject, []byte(`{"v":9,"entries":[]}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-env.log.Failed():
	case <-ctx.Done():
		t.Fatal("applier did not stop on a corrupt message")
	}
	var ce *CorruptError
	if err := env.log.Err(); !errors.As(err, &ce) || ce.Seq != 2 || !strings.Contains(err.Error(), "version 9") {
		t.Fatalf("applier error = %v; want a CorruptError at sequence 2", err)
	}
	if _, err := env.log.Write(ctx, submitEntry("r2", StepSpec{Name: "one"})); err == nil {
		t.Fatal("a write after the applier stopped succeeded")
	}
	if env.store.Applied() != 1 {
		t.Fatalf("applied %d, want 1", env.store.Applied())
	}
}
