package worker

import (
	"context"
	"encoding/json"
	"fmt"

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
func (p *Pool) drillPause(ctx context.Context, in steps.Input) (json.RawMessage, error) {
	r, err := p.cfg.State.Run(in.Run)
	if err != nil {
		return nil, err
	}
	if len(r.Epochs) > 1 {
		// The new owner waits here (for at most 3 TTLs) until the paused worker's commit
		// of this step has been decided, so that the step is not yet checkpointed when
		// that commit arrives and the run still runs: only the epoch check can fence it,
		// and the drill shows it doing so (stale-epoch).
		wctx, cancel := context.WithTimeout(ctx, 3*p.cfg.TTL)
		defer cancel()
		_ = waitFor(wctx, p.cfg.Log, func() bool {
			r, err := p.cfg.State.Run(in.Run)
			return err != nil || r.Fenced > 0
		})
		return json.RawMessage(`{"paused":false}`), nil
	}
	x := p.running(in.Run)
	if x == nil {
		return nil, steps.Permanentf("drill: run %s is not running on this node", in.Run)
	}
	d := p.cfg.TTL * 3 / 2
	x.log.Warn("drill: pausing this worker past its lease", "pause", d)
	x.mu.Lock()
	x.drillZombie = true
	x.mu.Unlock()
	x.lease.Freeze(d)
	t := p.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.Chan():
	case <-p.runCtx.Done():
	}
	return json.RawMessage(fmt.Sprintf(`{"paused":true,"by":%q,"epoch":%d}`, p.cfg.Node, in.Epoch)), nil
}

// DrillStep is the zombie drill's step kind (DrillStepKind), registered on every node.
func (p *Pool) DrillStep() steps.Step { return steps.Func(p.drillPause) }
