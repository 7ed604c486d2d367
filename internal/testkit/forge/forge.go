package forge

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/port"
)

// Writer publishes forged log messages on its own connection.
type Writer struct {
	nc *nats.Conn
	js jetstream.JetStream
}

// Dial connects to the node's NATS at url (engine.Engine.ClientURL).
func Dial(url string) (*Writer, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, fmt.Errorf("forge: connect to %s: %w", url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("forge: %w", err)
	}
	return &Writer{nc: nc, js: js}, nil
}

// Close closes the writer's connection.
func (w *Writer) Close() { w.nc.Close() }

// Write publishes entries as one log message from node "forge" and returns its
// sequence: where the log put it, not whether the state accepts it (the node's state,
// once caught up, says that).
func (w *Writer) Write(ctx context.Context, entries ...checkpoint.Entry) (uint64, error) {
	data, err := checkpoint.EncodeMessage("forge", entries...)
	if err != nil {
		return 0, err
	}
	ack, err := w.js.Publish(ctx, port.LogSubject, data)
	if err != nil {
		return 0, fmt.Errorf("forge: publish: %w", err)
	}
	return ack.Sequence, nil
}

// Publish publishes raw bytes on the log's subject (a message from a newer format, or
// none at all) and returns its sequence.
func (w *Writer) Publish(ctx context.Context, data []byte) (uint64, error) {
	ack, err := w.js.Publish(ctx, port.LogSubject, data)
	if err != nil {
		return 0, fmt.Errorf("forge: publish: %w", err)
	}
	return ack.Sequence, nil
}

// Open is Dial for a test: t fails if it cannot connect, and the writer closes when t
// ends.
func Open(t testing.TB, url string) *Writer {
	t.Helper()
	w, err := Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	return w
}

// Conn is the writer's connection (a test reads other streams on it too).
func (w *Writer) Conn() *nats.Conn { return w.nc }
