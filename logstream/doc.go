// Package logstream is the JetStream log around the checkpoint state machine: its I/O
// shell, in three parts that Open wires into a [Log]:
//
//   - [Writer] (writer.go): one write verb, [Writer.Write], returns a [Future]
//     (future.go). A lone writer publishes its message inline; otherwise the writer
//     packs whatever entries queued while the previous publish was in flight into one
//     message on FLOW_LOG (group commit: JetStream with SyncAlways costs one fsync per
//     message). Notes (step starts, retried failures) ride with the next message.
//   - [Applier] (applier.go, continuity.go): reads the stream in order and hands each
//     message to [checkpoint.Store.Apply] (the Writer's own, from memory, to
//     [checkpoint.Store.ApplyIfNext]), resolves Futures with the verdicts this node
//     computed, and refuses a log the state cannot continue from. Its consumer is a
//     supervised part ("log-consumer", internal/base/supervise): opened again whenever it
//     ends, or falls silent while the stream moves on.
//   - [Snapshots] (snapshots.go): the state in the FLOW_SNAPSHOTS object store, and
//     [PrepareState], the restore a joining node starts from.
//
// Configuration is a [Config] from [DefaultConfig], checked by [Config.Validate].
package logstream
