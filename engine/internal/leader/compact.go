package leader

import (
	"time"

	"github.com/flowrun/flow/checkpoint"
)

// SnapshotDue says whether the leader takes a snapshot: every `every` applied messages
// after the last one (at sequence last; 0: none yet).
func SnapshotDue(applied, last, every uint64) bool { return applied >= last+every }

// KeepFrom is the first log sequence compaction keeps: the first one a node restored
// from the newest snapshot (at snapshotSeq) needs, or the first one the slowest live
// node, or this node, has not applied, whichever is lowest. The log is purged below it
// when it is above the log's first sequence; so it never purges what a live node needs
// nor past the newest snapshot (a node that needs more restores that snapshot).
// liveLow is the lowest applied sequence the other live nodes reported (anyLive: some
// did).
func KeepFrom(snapshotSeq, liveLow uint64, anyLive bool, applied uint64) uint64 {
	keep := snapshotSeq + 1
	if anyLive {
		keep = min(keep, liveLow+1)
	}
	return min(keep, applied+1)
}

// RetireBatch bounds the runs one retention pass retires.
const RetireBatch = 1024

// RetentionEvery is how often the leader looks for runs to retire: a tenth of the
// retention, between a second and ten minutes (a pass reads every ended run).
func RetentionEvery(retention time.Duration) time.Duration {
	return min(max(retention/10, time.Second), 10*time.Minute)
}

// RetireDue returns a retire entry for up to limit runs that ended (succeeded, failed,
// cancelled) before cutoff. Dead-lettered runs stay until purged.
func RetireDue(st State, cutoff time.Time, limit int) ([]checkpoint.Entry, error) {
	var entries []checkpoint.Entry
	for _, s := range []checkpoint.RunStatus{checkpoint.StatusSucceeded, checkpoint.StatusFailed, checkpoint.StatusCancelled} {
		err := st.EachRun(checkpoint.ListOptions{Status: s}, func(r *checkpoint.Run) bool {
			if r.UpdatedAt.Before(cutoff) {
				entries = append(entries, checkpoint.Entry{Kind: checkpoint.KindRetire, Run: r.ID})
			}
			return len(entries) < limit
		})
		if err != nil {
			return entries, err
		}
		if len(entries) >= limit {
			break
		}
	}
	return entries, nil
}
