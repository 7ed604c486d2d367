package epoch

import (
	"sync/atomic"
	"time"
)

// Counters of ownership events, read by flowd's Prometheus collector. Safe for
// concurrent use; one value may be shared by every Elector and Lease of a node.
type Counters struct {
	RenewalsOK     atomic.Int64
	RenewalsFailed atomic.Int64
	TermsWon       atomic.Int64
	TermsLost      atomic.Int64
	LeasesAcquired atomic.Int64
	LeasesLost     atomic.Int64
	degradedNanos  atomic.Int64
}

// Degraded is the total time leases spent degraded (a renewal unanswered).
func (c *Counters) Degraded() time.Duration { return time.Duration(c.degradedNanos.Load()) }

func (c *Counters) addDegraded(d time.Duration) { c.degradedNanos.Add(int64(d)) }
