// Package natsnode starts the NATS JetStream server that flowd embeds by default, or
// connects to an external NATS (JetStream) server or cluster instead.
//
// The embedded server keeps its JetStream file store under the data dir and, unless the
// caller opts out, fsyncs every write (SyncAlways): the file store's default is to sync
// every two minutes, which would let a power cut lose writes that were already
// acknowledged. The cost (about one fsync per message) is why the checkpoint log packs
// many entries into one message.
package natsnode
