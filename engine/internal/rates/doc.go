// Package rates paces rate-limited steps across the cluster (a step's
// `rate_limit: {key, limit, per}`), by the generic cell rate algorithm over one KV entry
// per key in the FLOW_RATES bucket.
//
// A key's entry holds its theoretical arrival time (TAT): the moment from which the next
// start may go. A start reserves its moment at = max(TAT, now) and moves TAT to at plus
// the interval (per/limit) by a compare-and-set on the entry's revision; it then waits
// until at, and goes only if it wakes within the slack of it. Reservations are therefore
// spaced by the interval whichever node made them, in any order and across any failover
// (the entry is replicated state; no leader holds it), and a start that went late (a
// paused process, a node that slept) does not go at all: it reserves again at the back.
//
// The guarantee, with slack = min(100ms, per/10): in any window of length per, at most
// limit + 1 + limit·slack/per starts go (1.1·limit + 1 at most). Nodes read their own
// clocks: a node whose clock is ahead by d reserves d early, so skew adds limit·d/per
// (clocks are assumed NTP-close, as leases' trust deadlines already assume).
//
// What it costs: a read and a conditional write of one replicated entry per start (two
// round trips; a conflict with another node's reservation costs another two). A
// reservation whose holder dies before its moment is a gap: the rate is never exceeded
// by a lost reservation, only not reached.
package rates
