// Package supervise keeps flow's long-lived NATS interactions alive: the log's
// consumer, the election, the lease watcher, the task fetcher and the API service.
//
// A silent partition (no reset, no FIN, just no bytes) gives a long-lived subscription
// no error to react to: it simply hears nothing, for ever. So each such interaction is
// a Part with one rule: it proves it works by calling alive (a message, a renewal, a
// round trip that shows it is caught up), and the Supervisor presumes a part that has
// not done so for its Silence dead, cancels it, and starts it again with backoff; a
// part that ends with an error is started again the same way. Progress is not silence: a
// part calls alive at each step of a long catch-up (a watch replaying its initial
// values, an applier behind the log), so a slow machine does not restart it in a loop.
// Restarts in a row wait longer (DefaultBackoff, up to its cap); only a run that worked
// for ResetAfter starts the wait again from the base. The supervisor also says which
// parts are healthy and, for a restarting part, why it stopped and how often in a row
// (flowd's /readyz), counts restarts by part (flow_part_restarts_total{part}) and logs
// which part stopped and when it recovered. One pattern, instead of a watchdog each.
//
// The connection itself is not a part: nats.go notices a silent connection by its
// pings (flow derives the interval from the lease TTL) and reconnects on its own.
package supervise
