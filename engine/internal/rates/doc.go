// Package rates paces rate-limited steps across the cluster (a step's
// `rate_limit: {key, limit, per}`), by the generic cell rate algorithm over one KV entry
// per key in the FLOW_RATES bucket, on the server's clock.
//
// A key's entry is the last reservation: the theoretical arrival time (TAT) its writer
// read (Base) and its writer's rate. Its moment is max(Base, the entry's own server
// stamp), and the key's next TAT that moment plus the writer's interval (per/limit). A
// start reserves by writing the next entry on the read one's revision (a compare-and-set:
// two nodes that read the same entry cannot both write after it), then reads its own
// write back for its stamp: its moment is known to within that read, on the bucket
// leader's clock, and it waits for it on its own clock from the write's
// acknowledgement. Reservations are therefore spaced by the interval whichever node
// made them, whatever the nodes' clocks say, across any failover of flow's leader (the
// entry is replicated state; no flow leader holds it). A start that woke past its
// moment's slack, counting its write's round trip (a paused process, a node that
// slept, a slow path to the bucket), does not go: it reserves again, behind the others.
//
// The guarantee, with slack = min(100ms, per/10): in any window of length per, at most
// limit + 1 + limit·slack/per starts go (1.1·limit + 1 at most). The one clock is the
// bucket's leader's: when JetStream moves the bucket's leadership to a server whose
// clock differs by d, the starts around that move may be d closer.
//
// What it costs: three round trips per start (read, conditional write, read back); a
// conflict with another node's reservation costs them again. A reservation whose
// holder dies before its moment, or that another's write overtook before its read-back,
// is a gap: the rate is never exceeded by a lost reservation, only not reached.
package rates
