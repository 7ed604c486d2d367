// Package supervise keeps flow's long-lived NATS interactions alive: the log's
// consumer, the election, the lease watcher, the task fetcher and the API service.
//
// A silent partition (no reset, no FIN, just no bytes) gives a long-lived subscription
// no error to react to: it simply hears nothing, for ever. So each such interaction is
// a Part with one rule: it proves it works by calling alive (a message, a renewal, a
// round trip that shows it is caught up), and the Supervisor presumes a part that has
// not done so for its Silence dead, cancels it, and starts it again with backoff; a
// part that ends with an error is started again the same way. The supervisor also says
// which parts are healthy (flowd's /readyz), counts restarts (flowd's metrics) and logs
// which part stopped and when it recovered. One pattern, instead of a watchdog each.
//
// The connection itself is not a part: nats.go notices a silent connection by its
// pings (flow derives the interval from the lease TTL) and reconnects on its own.
package supervise
