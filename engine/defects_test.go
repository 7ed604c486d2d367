package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/natsnode"
	"github.com/flowrun/flow/internal/base/port"
	"github.com/flowrun/flow/workflow"
)

// A foreach over an empty list, or over null (what a Go step returns for a nil slice),
// runs zero items and succeeds, as ranging over a nil slice does in Go; the history says
// "0 items". A foreach over something that is not a list still fails, and says what it is.
func TestForeachOverEmptyOrNullRunsZeroItems(t *testing.T) {
	e := startEngine(t, nil)
	apply(t, e, `
name: empty
inputs:
  list: {type: string, default: "[]"}
steps:
  - name: make
    uses: exec
    with:
      command: [sh, -c, 'printf "{\"xs\": %s}" "$LIST"']
      env: {LIST: "{{ inputs.list }}"}
  - name: each
    needs: [make]
    foreach: "{{ steps.make.output.xs }}"
    uses: noop
    with: {x: "{{ item }}"}
  - name: after
    needs: [each]
    uses: noop
`)
	for _, list := range []string{"[]", "null"} {
		v := runToEnd(t, e, "empty", map[string]any{"list": list})
		if v.Run.Status != checkpoint.StatusSucceeded {
			t.Fatalf("foreach over %s: run %s: %s", list, v.Run.Status, v.Run.Error)
		}
		var each checkpoint.StepView
		for _, s := range v.Steps {
			if s.Name == "each" {
				each = s
			}
		}
		if each.Status != checkpoint.StepSucceeded || each.Items != 0 || each.ItemsDone != 0 || string(each.Output) != "[]" {
			t.Fatalf("foreach over %s: step %+v output %s, want succeeded with 0 items and []", list, each.Step, each.Output)
		}
		said := false
		for _, ev := range v.Events {
			if ev.Kind == checkpoint.KindStart && ev.Step == "each" && ev.Detail == "0 items" {
				said = true
			}
		}
		if !said {
			t.Fatalf("foreach over %s: the history does not say \"0 items\": %+v", list, v.Events)
		}
	}
	v := runToEnd(t, e, "empty", map[string]any{"list": `{"a": 1}`})
	if v.Run.Status != checkpoint.StatusFailed || !strings.Contains(v.Run.Error, "is an object, not a list") {
		t.Fatalf("foreach over an object: %s %q, want failed: is an object, not a list", v.Run.Status, v.Run.Error)
	}
}

// A claimed run that cannot be executed (its state unreadable, its workflow undecodable)
// is logged and its lease released; flowd does not panic. newRunExec returns no runExec
// with its error, and runClaimed once used that nil runExec before checking the error.
func TestRunClaimedThatCannotRunReleasesTheLease(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.DisableScheduler = true })
	ctx := ctxT(t, 20*time.Second)
	const ghost = "no-such-run"
	lease, err := e.leases.Acquire(ctx, ghost, 7, e.cfg.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	e.workers.RunClaimed(ghost, 7, lease, slog.New(slog.DiscardHandler))
	select {
	case <-lease.Done():
	case <-ctx.Done():
		t.Fatal("the lease of a run that cannot run was kept")
	}
	// Released, not merely lapsed: another owner can take the key at once.
	next, err := e.leases.Acquire(ctx, ghost, 8, "other")
	if err != nil {
		t.Fatalf("lease not free after runClaimed gave up: %v", err)
	}
	_ = next.Release(ctx)
}

// syncBuffer is a log sink tests read while the engine writes to it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// flowd starts on a stock nats-server (`nats-server -js`: 1 MiB max_payload, fsync every
// 2 minutes): the output limit is fitted to the server with a warning naming both
// numbers, the missing fsync is warned of, and a run's outputs up to the fitted limit
// commit while one over it fails its step with ErrOutputTooLarge's message.
func TestStartsOnAStockNATSServer(t *testing.T) {
	srv, err := natsnode.Start(natsnode.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", MaxPayload: 1 << 20, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	var logs syncBuffer
	e := startEngine(t, func(c *Config) {
		c.NATSURL = srv.ClientURL()
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	fit := e.clog.Writer.MaxOutputBytes()
	if fit >= 1<<20 || fit < 1<<19 {
		t.Fatalf("output limit %d on a 1 MiB server, want it fitted under 1 MiB", fit)
	}
	for _, want := range []string{"max_payload=1048576", fmt.Sprintf("max_output_bytes=%d", fit), "sync_interval: always"} {
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("start logs lack %q:\n%s", want, logs.String())
		}
	}
	apply(t, e, `
name: big
inputs:
  n: {type: int}
steps:
  - name: out
    uses: exec
    with:
      command: [sh, -c, 'printf "{\"s\": \"%s\"}" "$(head -c "$N" /dev/zero | tr "\\0" x)"']
      env: {N: "{{ inputs.n }}"}
`)
	const wrap = len(`{"s": ""}`)
	if v := runToEnd(t, e, "big", map[string]any{"n": fit - wrap}); v.Run.Status != checkpoint.StatusSucceeded {
		t.Fatalf("an output of the fitted limit: %s %s", v.Run.Status, v.Run.Error)
	}
	v := runToEnd(t, e, "big", map[string]any{"n": fit - wrap + 1})
	if v.Run.Status != checkpoint.StatusFailed || !strings.Contains(v.Run.Error, "limit is") {
		t.Fatalf("an output one byte over the fitted limit: %s %q, want failed naming the limit", v.Run.Status, v.Run.Error)
	}
}

// On its own embedded server (fsync on every write, 8 MiB messages) flowd warns of
// neither: the warnings above are about the server, not noise on every start.
func TestEmbeddedServerStartsWithoutWarnings(t *testing.T) {
	var logs syncBuffer
	startEngine(t, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	if s := logs.String(); strings.Contains(s, "max_payload") || strings.Contains(s, "sync_interval") {
		t.Fatalf("embedded start warned:\n%s", s)
	}
}

// An int input and a step output's integers reach later steps exactly, past 2^53:
// through float64, 9007199254740993 became 9007199254740992.
func TestInt64StaysExactEndToEnd(t *testing.T) {
	e := startEngine(t, nil)
	apply(t, e, `
name: exact
inputs:
  n: {type: int}
steps:
  - name: echo
    uses: exec
    with:
      command: [sh, -c, 'printf "{\"n\": %s, \"big\": 9007199254740995}" "$N"']
      env: {N: "{{ inputs.n }}"}
  - name: again
    needs: [echo]
    uses: noop
    with: {n: "{{ steps.echo.output.n }}", big: "{{ steps.echo.output.big }}", text: "n={{ inputs.n }}"}
`)
	const n = "9007199254740993"
	for _, given := range []any{n, json.Number(n)} {
		v := runToEnd(t, e, "exact", map[string]any{"n": given})
		if v.Run.Status != checkpoint.StatusSucceeded {
			t.Fatalf("run %s: %s", v.Run.Status, v.Run.Error)
		}
		if string(v.Run.Inputs) != `{"n":`+n+`}` {
			t.Fatalf("stored inputs %s, want n exactly %s", v.Run.Inputs, n)
		}
		var again json.RawMessage
		for _, s := range v.Steps {
			if s.Name == "again" {
				again = s.Output
			}
		}
		for _, want := range []string{`"n":` + n, `"big":9007199254740995`, `"text":"n=` + n + `"`} {
			if !strings.Contains(string(again), want) {
				t.Fatalf("given %T: output %s lacks %s", given, again, want)
			}
		}
	}
}

// Tasks naming a run that cannot exist (forged: IDs that are no KV key, no epoch) are
// dropped once, not redelivered in a loop that keeps workers busy; real runs go on.
func TestForgedTasksAreDroppedNotLooped(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.Workers = 2 })
	waitLeader(t, e)
	ctx := ctxT(t, 30*time.Second)
	for _, body := range []string{`{"run":"a.","epoch":5}`, `{"run":"a..b","epoch":5}`, `{"run":"x","epoch":0}`, `not json`,
		`{"run":"a.","epoch":6}`, `{"run":"b.","epoch":7}`, `{"run":"c..d","epoch":8}`, `{"run":"e.","epoch":9}`} {
		if _, err := e.js.Publish(ctx, port.TasksSubject, []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	apply(t, e, workflow.ChainYAML("chain", 2))
	if v := runToEnd(t, e, "chain", nil); v.Run.Status != checkpoint.StatusSucceeded {
		t.Fatalf("a real run beside forged tasks: %s %s", v.Run.Status, v.Run.Error)
	}
	for {
		cons, err := e.js.Consumer(ctx, port.TasksStream, port.TasksConsumer)
		if err != nil {
			t.Fatal(err)
		}
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			if info.NumRedelivered != 0 {
				t.Fatalf("forged tasks were redelivered %d times before they were dropped", info.NumRedelivered)
			}
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("forged tasks still pending after 30s (pending %d, unacked %d, redelivered %d): they loop",
				info.NumPending, info.NumAckPending, info.NumRedelivered)
		case <-e.clog.Applier.Changed():
		case <-time.After(50 * time.Millisecond): // consumer state is not in the log: look again
		}
	}
}
