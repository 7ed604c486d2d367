package engine

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/gate"
	"github.com/flowrun/flow/engine/internal/nodes"
	"github.com/flowrun/flow/internal/base/jsport"
)

// The cluster version (docs/operations.md, "Upgrading"; engine/internal/gate): each
// node registers the log formats it reads in the roster when it starts; the leader
// raises the version once every member reads the next format; an older binary is
// refused once the version moved past it.

// ErrTooOld: this flowd cannot read the cluster's log format (gate.ErrTooOld).
var ErrTooOld = gate.ErrTooOld

// register records this node in the roster, refused when the cluster's version is past
// what this binary reads.
func (e *Engine) register(ctx context.Context) error {
	m := gate.Member{Binary: Binary(), Formats: e.cfg.readFormats(), Hold: e.cfg.HoldClusterVersion, Since: e.cfg.Clock.Now().UTC()}
	r, err := e.gate.Register(ctx, e.cfg.NodeID, m, e.store.ClusterVersion())
	if jsport.IsSealed(err) {
		// The roster was read (a cluster past this binary refuses it before the write)
		// and cannot be written: nor can a promise of a newer version, so the version
		// stays where this node reads it. Starting lets cluster repair be run.
		e.log.Error("the cluster roster (KV_FLOW_CLUSTER) is sealed: this node starts unregistered, and the cluster version cannot move until it is mended: run `"+jsport.RepairCommand+"`", "err", err)
		return nil
	}
	if err != nil {
		return err
	}
	if m.Hold {
		e.log.Warn("holding the cluster version (--hold-cluster-version): it stays while this node is a member", "version", max(r.Version, e.store.ClusterVersion()))
	}
	return nil
}

// gatePromoter is the leader's Gate: the live reports from the nodes bucket, the
// promise in the roster.
type gatePromoter struct{ e *Engine }

func (g gatePromoter) Promote(ctx context.Context, applied int) (int, string, error) {
	e := g.e
	defer e.gatePasses.Add(1)
	live, err := nodes.Live(ctx, e.ports.Nodes)
	if err != nil {
		return 0, "", fmt.Errorf("read the live nodes: %w", err)
	}
	seen := make(map[string]gate.Seen, len(live))
	for id, r := range live {
		seen[id] = gate.Seen{Binary: r.Binary, Formats: r.Formats}
	}
	if _, err := e.gate.Infer(ctx, seen, e.cfg.Clock.Now().UTC()); err != nil {
		return 0, "", err
	}
	r, promised, err := e.gate.Promise(ctx, applied)
	if err != nil {
		return 0, "", err
	}
	if e.hooks.GateIgnoresRoster.Load() && promised == 0 && r.Holders() == "" && applied < checkpoint.NewestLogFormat {
		return checkpoint.NewestLogFormat, "", nil // the gate's control: whatever the members read
	}
	if promised == 0 {
		promised = r.Version // an earlier leader's promise, perhaps not yet in the log
	}
	_, why := r.Next(applied)
	return promised, why, nil
}

// clusterRoster is the roster with the applied cluster version.
func (e *Engine) clusterRoster(ctx context.Context) (gate.Roster, int, error) {
	r, err := e.gate.Roster(ctx)
	return r, e.store.ClusterVersion(), err
}

// ForgetNode removes a node that is gone for good from the roster, so that the
// cluster version can move past what it read. A live node is refused: one whose report
// has not lapsed and did not say goodbye (nodes.Live), as cluster status's LIVE, which
// asks the running nodes, would have it but for a killed node's last minute.
func (o Ops) ForgetNode(ctx context.Context, node string) error {
	e := o.e
	live, err := nodes.Live(ctx, e.ports.Nodes)
	if err != nil {
		return fmt.Errorf("engine: read the live nodes: %w", err)
	}
	_, isLive := live[node]
	_, err = e.gate.Forget(ctx, node, isLive)
	return err // gate.ErrLive, gate.ErrUnknown: the API answers conflict, not found
}

// HoldClusterVersion sets (hold) or releases an operator's hold on the cluster version.
func (o Ops) HoldClusterVersion(ctx context.Context, hold bool, by, reason string) error {
	e := o.e
	var h *gate.Hold
	if hold {
		h = &gate.Hold{By: by, Reason: strings.TrimSpace(reason), At: e.cfg.Clock.Now().UTC()}
	}
	_, err := e.gate.SetHold(ctx, h)
	return err
}

// WaitClusterVersion waits until this node applied cluster version v (or ctx ends, or
// the node stops: a request waiting for the version must not outlive its node).
func (o Ops) WaitClusterVersion(ctx context.Context, v int) error {
	e := o.e
	for e.store.ClusterVersion() < v {
		changed := e.Changed()
		if e.store.ClusterVersion() >= v {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-e.stopped:
			return ErrNotStarted
		case <-changed:
		case <-time.After(time.Second):
		}
	}
	return nil
}
