package logstream

import (
	"context"
	"fmt"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/testhooks"
)

// Log is one node's log, as Open wires it: three parts, each with its own methods, and
// a Start and Stop that take them in the right order. It holds nothing else.
type Log struct {
	// Writer appends entries (Write) with group commit.
	Writer *Writer
	// Applier applies the stream to the Store and resolves the Writer's Futures.
	Applier *Applier
	// Snapshots writes the state to the snapshot bucket and lists it.
	Snapshots *Snapshots
}

// Open validates cfg (Config.Validate) and returns the node's log, ready to Start. The step output limit is fitted to the NATS server's
// max_payload (with a warning) when the server cannot hold it, and refused when the
// server leaves no room for a useful one.
func Open(cfg Config) (*Log, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.logger().With("component", "log")
	maxPayload := cfg.Stream.MaxPayload()
	maxOutput := cfg.MaxOutputBytes
	// An output of the limit must fit one message with its entry's other fields and
	// the envelope: a headroom for each.
	if fit := maxPayload - 2*envelopeHeadroom; maxOutput > fit {
		// A stock nats-server allows 1 MiB messages, exactly the default output limit:
		// fit the limit to the server rather than refuse to start, and say so.
		if fit < minOutputBytes {
			return nil, fmt.Errorf("%w: the NATS server's max_payload %d leaves no room for step outputs (flow needs at least %d bytes): raise max_payload on the server (e.g. max_payload: 8MB)",
				checkpoint.ErrInvalidEntry, maxPayload, minOutputBytes+2*envelopeHeadroom)
		}
		cfg.logger().Warn("step outputs are limited by the NATS server's max_payload; raise max_payload on the server (e.g. 8MB) to allow larger ones",
			"max_output_bytes", fit, "asked", maxOutput, "max_payload", maxPayload)
		maxOutput = fit
	}
	hooks := testhooks.OrProduction(cfg.Hooks)
	a := newApplier(cfg, hooks, log)
	return &Log{
		Applier:   a,
		Writer:    newWriter(cfg, a, maxOutput, maxPayload-envelopeHeadroom, hooks, log),
		Snapshots: newSnapshots(cfg, log),
	}, nil
}

// Start starts the applier (replaying from the store's applied sequence; a log the
// state cannot continue from fails here), then the writer.
func (l *Log) Start(ctx context.Context) error {
	if err := l.Applier.Start(ctx); err != nil {
		return err
	}
	return l.Writer.Start(ctx)
}

// Stop stops the writer (queued writes get ErrStopped), then the applier, and waits for
// both. Safe to call twice and before Start.
func (l *Log) Stop() {
	l.Writer.Stop()
	l.Applier.Stop()
}
