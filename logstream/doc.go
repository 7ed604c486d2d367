// Package logstream is the JetStream log around the checkpoint state machine: its I/O
// shell. The writer packs whatever entries queued while the previous publish was in
// flight into one message on FLOW_LOG (group commit: JetStream with SyncAlways costs one
// fsync per message); the consumer reads the stream in order and hands each message to
// [checkpoint.Store.Apply]; a writer [Ticket.Await]s the verdict its own node computed.
//
// The consumer is a supervised part ("log-consumer", internal/supervise): opened again
// whenever it ends, or falls silent while the stream moves on.
package logstream
