// Package epoch holds flow's two kinds of ownership over JetStream KV: the scheduler
// leader's term ([Elector], [Term]) and a worker's lease on a run at one epoch ([Lease]),
// plus the leader's view of every lease ([LeaseWatcher]).
//
// Both follow one pattern, in the spirit of etcd's concurrency package: a key created
// with Create (the winning revision is the term), renewed by compare-and-set every
// RenewInterval (TTL/3), and lapsing on the server by itself when the renewals stop (the
// bucket's TTL). The holder trusts itself only until two thirds of the TTL after it
// *sent* its last successful renewal, on its own monotonic clock: its belief always ends
// before the server's lease does. When the trust window passes or a renewal is refused,
// the holder's context is cancelled at once (the kill switch), and Check, called before
// every write that depends on the ownership, fails.
//
// The holder's timing decisions (when to renew, when the trust window closes, when the
// poison pill fires, whether it is degraded) are a pure value, [Trust], under a policy,
// [LeaseClock]: methods that take the time and do no I/O, which the keeper goroutine
// carries out on Config.Clock (real by default, a clockwork.FakeClock in tests) and a
// simulation can drive on its own clock. testdata/*.txt are its transcripts.
//
// None of this is the safety: a holder paused between Check and its write still writes.
// Safety is the epoch (or term) the write carries, which the checkpoint log rejects when
// stale. Leases make a dead holder's run move on quickly; fencing makes a live zombie
// harmless.
package epoch
