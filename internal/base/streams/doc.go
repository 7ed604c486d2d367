// Package streams creates and inspects flow's JetStream streams and buckets through the
// NATS client alone: it links no server code, so the packages that need a stream
// (checkpoint's log, epoch's buckets, the DLQ, the task queue) do not link the embedded
// server either. internal/base/natsnode starts that server.
package streams
