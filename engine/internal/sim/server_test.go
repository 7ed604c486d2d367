package sim

import (
	"testing"

	"github.com/flowrun/flow/internal/base/port"
)

// A watch that starts after the leader bucket's term raise purged a key sees the keys
// that remain, not the purged one (whose events the bucket still holds): the initial
// values once read the purged key's missing entry and crashed the simulation.
func TestWatchAfterARaise(t *testing.T) {
	b := &bucket{name: port.LeaderBucket, keys: map[string]*kvEntry{}}
	b.keys["old"] = &kvEntry{rev: 1, live: true}
	b.keys["new"] = &kvEntry{rev: 2, live: true}
	b.events = []port.Entry{{Key: "old", Revision: 1}, {Key: "new", Revision: 2}}
	b.rev = 2
	b.raise(1)
	got, last := b.initial("")
	if len(got) != 1 || got[0].Key != "new" || last != 2 {
		t.Fatalf("initial values after the raise: %+v (last %d); want the key new alone", got, last)
	}
}
