package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/steps"
)

// DrillStepKind is the step kind of the zombie drill, registered on every engine.
const DrillStepKind = "flow-drill-pause"

// DrillWorkflow is the workflow `flowctl drill zombie` runs.
const DrillWorkflow = `name: flow-drill-zombie
description: flowctl drill zombie - a worker paused past its lease, then fenced
max_epochs: 10
steps:
  - name: before
    uses: noop
  - name: pause
    needs: [before]
    uses: ` + DrillStepKind + `
  - name: after
    needs: [pause]
    uses: noop
`

// drillPause is the drill's step. In the run's first epoch it plays a paused process:
// its lease's renewals and watchdog stop for 1.5 TTL (the lease lapses, the leader
// reclaims, another worker takes the run over), and when it wakes its commit skips
// the local lease check, as a process whose pause fell between its check and its
// write. The log fences that commit. In later epochs it waits for that, then does
// nothing.
func (e *Engine) drillPause(ctx context.Context, in steps.Input) (json.RawMessage, error) {
	r, err := e.store.Run(in.Run)
	if err != nil {
		return nil, err
	}
	if len(r.Epochs) > 1 {
		// The new owner waits here (for at most 3 TTLs) until the paused worker's commit
		// of this step has been decided, so that the step is not yet checkpointed when
		// that commit arrives and the run still runs: only the epoch check can fence it,
		// and the drill shows it doing so (stale-epoch).
		wctx, cancel := context.WithTimeout(ctx, 3*e.leases.Config().TTL)
		defer cancel()
		_ = waitFor(wctx, e.clog.Applier, func() bool {
			r, err := e.store.Run(in.Run)
			return err != nil || r.Fenced > 0
		})
		return json.RawMessage(`{"paused":false}`), nil
	}
	e.mu.Lock()
	x := e.mu.running[in.Run]
	e.mu.Unlock()
	if x == nil {
		return nil, steps.Permanentf("drill: run %s is not running on this node", in.Run)
	}
	d := e.leases.Config().TTL * 3 / 2
	x.log.Warn("drill: pausing this worker past its lease", "pause", d)
	x.mu.Lock()
	x.drillZombie = true
	x.mu.Unlock()
	x.lease.Freeze(d)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-e.stopped:
	}
	return json.RawMessage(fmt.Sprintf(`{"paused":true,"by":%q,"epoch":%d}`, e.cfg.NodeID, in.Epoch)), nil
}

// DrillZombie runs the drill and returns the run once it ended.
func (e *Engine) DrillZombie(ctx context.Context) (*checkpoint.RunView, error) {
	if _, err := e.ApplyWorkflow(ctx, "drill-zombie.yaml", []byte(DrillWorkflow)); err != nil {
		return nil, err
	}
	id, err := e.StartRun(ctx, "flow-drill-zombie", nil, RunOptions{})
	if err != nil {
		return nil, err
	}
	if _, err := e.WaitRun(ctx, id); err != nil {
		return nil, err
	}
	// The new owner may finish before the paused one wakes: wait for its fenced commit.
	if err := waitFor(ctx, e.clog.Applier, func() bool {
		r, err := e.store.Run(id)
		return err == nil && r.Fenced > 0
	}); err != nil {
		return nil, fmt.Errorf("engine: drill: the paused worker's commit never reached the log: %w", err)
	}
	return e.Run(id)
}
