package engine

import (
	"errors"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/port"
	"github.com/flowrun/flow/internal/base/testhooks"
)

// Over is what NewOver builds an engine on instead of NATS and a data dir: the
// simulation's (engine/internal/sim) ports, with its faults, and its in-memory disk.
type Over struct {
	// Ports are the node's streams and buckets.
	Ports port.Ports
	// FS and StateDir are where the state lives (Pebble's vfs: vfs.NewMem in the
	// simulation, kept across the node's restarts as a disk is).
	FS       vfs.FS
	StateDir string
	// Nonce tells this life's log message IDs from the node's earlier lives' (the
	// simulation draws it from its seed, so that a seed replays exactly).
	Nonce string
	// Order orders this node's concurrent log writers (logstream.Config.Order).
	Order func([]checkpoint.Entry)
	// Hooks are the switches the simulation's controls turn guards off with (nil:
	// production's).
	Hooks *testhooks.Hooks
}

// NewOver is New for an engine that runs over ports instead of NATS: everything of a
// flowd node but the NATS connection, the embedded server and the checks of the streams
// (which only JetStream has), over the same services and the same library API. Flow's
// simulation builds its nodes so (DESIGN.md, invariant 18: its nodes run the same shell
// code as flowd; only the ports differ).
func NewOver(cfg Config, over Over) (*Engine, error) {
	switch {
	case over.Ports.Log == nil || over.Ports.Leader == nil || over.Ports.Leases == nil || over.Ports.Tasks == nil ||
		over.Ports.Nodes == nil || over.Ports.Cluster == nil || over.Ports.DLQ == nil:
		return nil, errors.New("engine: NewOver needs every port but Snapshots and Terms")
	case over.FS == nil || over.StateDir == "":
		return nil, errors.New("engine: NewOver needs the state's FS and StateDir")
	}
	if cfg.DataDir == "" {
		cfg.DataDir = over.StateDir // Validate wants one; nothing is written there
	}
	e, err := New(cfg)
	if err != nil {
		return nil, err
	}
	e.over = &over
	if over.Hooks != nil {
		e.hooks = over.Hooks
	}
	return e, nil
}
