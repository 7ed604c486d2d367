package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/flowrun/flow/steps"
)

// helperMain runs a child-process role of this test binary (a flowd node running given
// runs to their end, to be SIGKILLed by the test); it reports whether it did.
//
//	FLOW_ENGINE_HELPER=<data dir>  FLOW_ENGINE_HELPER_WORKFLOW=<yaml file>
//	FLOW_ENGINE_HELPER_RUNS=<id>,<id>...  FLOW_ENGINE_HELPER_RECORD=<file>
func helperMain() bool {
	dir := os.Getenv("FLOW_ENGINE_HELPER")
	if dir == "" {
		return false
	}
	say := func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	fail := func(err error) { say("error %v", err); os.Exit(2) }
	reg := steps.NewRegistry(0)
	record := os.Getenv("FLOW_ENGINE_HELPER_RECORD")
	// record appends "<run> <step> <item> <epoch>" to a file: the side effect a kill may
	// repeat, outside the store, with the epoch that ran it.
	_ = reg.Register("record", steps.Func(func(ctx context.Context, in steps.Input) (json.RawMessage, error) {
		f, err := os.OpenFile(record, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return nil, err
		}
		_, err = fmt.Fprintf(f, "%s %s %d %d\n", in.Run, in.Step, in.Item, in.Epoch)
		f.Close()
		if hold, _ := time.ParseDuration(fmt.Sprint(in.With["hold"])); hold > 0 && err == nil {
			t := time.NewTimer(hold) // the step's work after its side effect: a kill lands here
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return json.RawMessage(`{"item":` + strconv.Itoa(in.Item) + `}`), err
	}))
	e, err := New(Config{NodeID: "crashy", DataDir: dir, NATSListen: "-", Lease: testLease, Workers: 2, Registry: reg})
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	if err := e.Start(ctx); err != nil {
		fail(err)
	}
	yaml, err := os.ReadFile(os.Getenv("FLOW_ENGINE_HELPER_WORKFLOW"))
	if err != nil {
		fail(err)
	}
	w, err := e.ApplyWorkflow(ctx, "crash.yaml", yaml)
	if err != nil {
		fail(err)
	}
	for _, id := range strings.Split(os.Getenv("FLOW_ENGINE_HELPER_RUNS"), ",") {
		if _, err := e.store.Run(id); err != nil {
			if _, err := e.StartRun(ctx, w.Name, nil, RunOptions{ID: id}); err != nil {
				fail(err)
			}
		}
		say("running %s", id)
		r, err := e.WaitRun(ctx, id)
		if err != nil {
			fail(err)
		}
		say("done %s %s", id, r.Status)
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = e.Stop(sctx)
	say("all-done")
	os.Exit(0)
	return true
}
