package steplog

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/base/port"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memLogs is a port.StepLogs in memory, deduplicating message IDs as the stream does.
type memLogs struct {
	mu   sync.Mutex
	msgs []port.Message
	runs []string
	seen map[string]bool
	fail bool
}

func (m *memLogs) Append(_ context.Context, run, msgID string, data []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return fmt.Errorf("no server")
	}
	if m.seen == nil {
		m.seen = map[string]bool{}
	}
	if m.seen[msgID] {
		return nil
	}
	m.seen[msgID] = true
	m.msgs = append(m.msgs, port.Message{Seq: uint64(len(m.msgs) + 1), ID: msgID, Data: data})
	m.runs = append(m.runs, run)
	return nil
}

func (m *memLogs) Next(_ context.Context, run string, after uint64) (port.Message, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := int(after); i < len(m.msgs); i++ {
		if m.runs[i] == run {
			return m.msgs[i], true, nil
		}
	}
	return port.Message{}, false, nil
}

func (m *memLogs) Remove(_ context.Context, run string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.runs {
		if m.runs[i] == run {
			m.runs[i] = ""
		}
	}
	return nil
}

func readAll(t *testing.T, logs port.StepLogs, run string, f Filter) []client.LogLine {
	t.Helper()
	lines, _, err := Read(context.Background(), logs, run, 0, f, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

func texts(lines []client.LogLine) []string {
	var out []string
	for _, l := range lines {
		out = append(out, l.Stream+":"+l.Line)
	}
	return out
}

// What a step writes, in pieces that split lines anywhere, comes back as whole lines,
// each once, in order, with its key; a line not ended when the step returns is kept.
func TestLinesComeBackWholeAndOnce(t *testing.T) {
	logs := &memLogs{}
	s := NewSink(Config{Logs: logs, Node: "n"})
	w := s.Open(Key{Run: "r", Step: "a", Item: -1, Attempt: 2, Epoch: 7}, nil)
	out := w.Stream("stdout")
	for _, p := range []string{"he", "llo\nwor", "ld\r\n", "", "last"} {
		_, _ = out.Write([]byte(p))
	}
	_, _ = w.Stream("stderr").Write([]byte("oops\n"))
	w.Close()
	_, _ = out.Write([]byte("after close\n")) // dropped
	got := readAll(t, logs, "r", Filter{})
	want := []string{"stdout:hello", "stdout:world", "stderr:oops", "stdout:last"}
	if strings.Join(texts(got), "|") != strings.Join(want, "|") {
		t.Fatalf("got %q, want %q", texts(got), want)
	}
	for _, l := range got {
		if l.Step != "a" || l.Item != nil || l.Attempt != 2 || l.Epoch != 7 || l.At == "" {
			t.Fatalf("line %+v: want step a, no item, attempt 2, epoch 7, a time", l)
		}
	}
}

// Past the limit nothing more is kept: a marker says where it stopped and, at the end,
// how much was not kept. 10 MB in 1 KiB lines against a 64 KiB limit.
func TestLimitTruncatesWithAMarker(t *testing.T) {
	logs := &memLogs{}
	s := NewSink(Config{Logs: logs, Node: "n", Limit: 64 << 10})
	w := s.Open(Key{Run: "r", Step: "big", Item: 3, Attempt: 1, Epoch: 1}, nil)
	line := strings.Repeat("x", 1023) + "\n"
	for range 10 << 10 {
		_, _ = w.Stream("stdout").Write([]byte(line))
	}
	w.Close()
	got := readAll(t, logs, "r", Filter{})
	kept := 0
	for _, l := range got {
		if l.Stream == "stdout" {
			kept += len(l.Line) + 1
		}
	}
	if kept > 64<<10 || kept < 60<<10 {
		t.Fatalf("kept %d bytes of lines, want just under the 64 KiB limit", kept)
	}
	n := len(got)
	if n < 2 || !strings.Contains(got[n-2].Line, "log truncated") || got[n-2].Stream != "flow" ||
		!strings.Contains(got[n-1].Line, "bytes of this attempt's output were not kept") {
		t.Fatalf("the last lines %q: want the truncation marker and the count", texts(got[max(0, n-2):]))
	}
	if *got[0].Item != 3 {
		t.Fatalf("item %v, want 3", got[0].Item)
	}
}

// A run's secrets are masked in every line, however the writes split them; a secret
// shorter than MinSecret is not (it would mask letters everywhere). Control: without a
// masker the secret is there.
func TestSecretsAreMasked(t *testing.T) {
	for _, masking := range []bool{true, false} {
		logs := &memLogs{}
		s := NewSink(Config{Logs: logs, Node: "n"})
		var m *Masker
		if masking {
			m = NewMasker([]any{"hunter2-token", "ab", 12345678})
		}
		w := s.Open(Key{Run: "r", Step: "a", Item: -1, Attempt: 1, Epoch: 1}, m)
		for _, p := range []string{"token=hunt", "er2-token; ab\n", "pin 12345678\n"} {
			_, _ = w.Stream("stdout").Write([]byte(p))
		}
		w.Close()
		all := strings.Join(texts(readAll(t, logs, "r", Filter{})), "|")
		leaked := strings.Contains(all, "hunter2-token") || strings.Contains(all, "12345678")
		if masking && (leaked || !strings.Contains(all, "token=***; ab") || !strings.Contains(all, "pin ***")) {
			t.Fatalf("masked: %q", all)
		}
		if !masking && !leaked {
			t.Fatalf("control: without masking the secret should be there: %q", all)
		}
	}
}

// Outputs: the secret is masked in every string, keys too, and the document stays JSON;
// one without a secret is returned as the step wrote it.
func TestMaskJSON(t *testing.T) {
	m := NewMasker([]any{"s3cr3t"})
	out := m.JSON(json.RawMessage(`{"a":"x s3cr3t y","s3cr3t":[1,"s3cr3t"],"n":1.50}`))
	if strings.Contains(string(out), "s3cr3t") || !json.Valid(out) || !strings.Contains(string(out), `"n":1.50`) {
		t.Fatalf("masked output %s", out)
	}
	same := json.RawMessage(`{"b": 2,  "a": 1}`)
	if got := m.JSON(same); string(got) != string(same) {
		t.Fatalf("unchanged output rewritten: %s", got)
	}
	var none *Masker
	if got := none.JSON(same); string(got) != string(same) {
		t.Fatalf("nil masker changed %s", got)
	}
}

// Lines are appended while the step runs (not only at its end): a reader following the
// run sees the first line before the step returns.
func TestLinesAreAppendedWhileTheStepRuns(t *testing.T) {
	logs := &memLogs{}
	s := NewSink(Config{Logs: logs, Node: "n", FlushEvery: 10 * time.Millisecond})
	w := s.Open(Key{Run: "r", Step: "a", Item: -1, Attempt: 1, Epoch: 1}, nil)
	defer w.Close()
	_, _ = w.Stream("stdout").Write([]byte("first\n"))
	deadline := time.Now().Add(10 * time.Second)
	for len(readAll(t, logs, "r", Filter{})) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first line was not appended while the step ran")
		}
		time.Sleep(5 * time.Millisecond) // polling the store, with a deadline
	}
}

// Many writers at once (stdout and stderr copied by two goroutines, a foreach's items)
// lose no line and repeat none; the filter narrows by step, item and attempt.
func TestConcurrentWritersAndFilters(t *testing.T) {
	logs := &memLogs{}
	s := NewSink(Config{Logs: logs, Node: "n", FlushEvery: time.Millisecond})
	var wg sync.WaitGroup
	for item := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := s.Open(Key{Run: "r", Step: "each", Item: item, Attempt: 1, Epoch: 1}, nil)
			var inner sync.WaitGroup
			for _, stream := range []string{"stdout", "stderr"} {
				inner.Add(1)
				go func() {
					defer inner.Done()
					for i := range 500 {
						fmt.Fprintf(w.Stream(stream), "%s %d\n", stream, i)
					}
				}()
			}
			inner.Wait()
			w.Close()
		}()
	}
	wg.Wait()
	if got := readAll(t, logs, "r", Filter{}); len(got) != 4*1000 {
		t.Fatalf("%d lines, want 4000", len(got))
	}
	two := 2
	got := readAll(t, logs, "r", Filter{Step: "each", Item: &two, Attempt: 1})
	seen := map[string]bool{}
	for _, l := range got {
		if *l.Item != 2 || seen[l.Stream+l.Line] {
			t.Fatalf("line %+v: wrong item or repeated", l)
		}
		seen[l.Stream+l.Line] = true
	}
	if len(got) != 1000 {
		t.Fatalf("item 2: %d lines, want 1000", len(got))
	}
	if got := readAll(t, logs, "r", Filter{Attempt: 2}); len(got) != 0 {
		t.Fatalf("attempt 2: %d lines, want none", len(got))
	}
}

// A log that cannot be kept does not stop the step: writes return at once and succeed.
func TestAFailingStoreDoesNotFailTheStep(t *testing.T) {
	logs := &memLogs{fail: true}
	s := NewSink(Config{Logs: logs, Node: "n"})
	w := s.Open(Key{Run: "r", Step: "a", Item: -1, Attempt: 1, Epoch: 1}, nil)
	if n, err := w.Stream("stdout").Write([]byte("x\n")); n != 2 || err != nil {
		t.Fatalf("write: %d %v", n, err)
	}
	w.Close()
	var nilSink *Sink
	w = nilSink.Open(Key{Run: "r"}, nil)
	_, _ = w.Stream("stdout").Write([]byte("x\n"))
	w.Close()
}

// An attempt run again under the same key (a step its init stopped at the trust
// deadline while the lease held runs again, uncounted) keeps both runs' lines: the
// second writer's appends are not taken for retries of the first's.
func TestTheSameKeyTwiceKeepsBoth(t *testing.T) {
	logs := &memLogs{}
	s := NewSink(Config{Logs: logs, Node: "n"})
	k := Key{Run: "r", Step: "a", Item: -1, Attempt: 1, Epoch: 1}
	for _, text := range []string{"first try\n", "second try\n"} {
		w := s.Open(k, nil)
		_, _ = w.Stream("stdout").Write([]byte(text))
		w.Close()
	}
	if got := texts(readAll(t, logs, "r", Filter{})); strings.Join(got, "|") != "stdout:first try|stdout:second try" {
		t.Fatalf("got %q", got)
	}
}
