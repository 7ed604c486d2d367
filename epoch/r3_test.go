package epoch

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/internal/base/jsport"
	"github.com/flowrun/flow/internal/base/natsnode"
	"github.com/flowrun/flow/internal/testkit/within"
)

// On a replicated (R3) bucket, kv.Get may be answered by a replica with an older
// revision and an Update may fail with 10164 although the revision did not move
// (../shared/FACTS.md). Leases must survive both: under concurrent load, sixteen
// leases renewed for several TTLs on an R3 bucket are never lost, and readLatest always
// sees the newest revision right after a write.
func TestR3LeasesSurviveStaleReadsAndSpuriousConflicts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	servers, err := natsnode.StartLocalCluster(t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, s := range servers {
			s.Shutdown()
		}
	}()
	var urls []string
	for _, s := range servers {
		urls = append(urls, s.ClientURL())
	}
	nc, js := connect(t, strings.Join(urls, ","))
	if r := jsport.Replicas(nc); r != 3 {
		t.Fatalf("replicas for a 3-node cluster = %d", r)
	}
	ctx := ctxT(t, 60*time.Second)
	// A TTL with room for -race on two busy cores (1 s lost a lease there, a renewal
	// late, not a stale read): the property is about reads and conflicts, not timing.
	cfg := testConfig()
	cfg.TTL = 3 * time.Second
	ls, err := newLeases(ctx, js, cfg, 3)
	if err != nil {
		t.Fatal(err)
	}
	// readLatest right after each write sees that write.
	for i := 0; i < 50; i++ {
		rev, err := ls.kv.Put(ctx, "probe", []byte(fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		l, err := latestOf(ctx, js, LeaseBucket, "probe")
		if err != nil || l.rev != rev || string(l.value) != fmt.Sprint(i) {
			t.Fatalf("write %d at revision %d, read back %+v (%v)", i, rev, l, err)
		}
	}
	// Load on the same bucket while sixteen leases renew.
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; loadCtx.Err() == nil; i++ {
				_, _ = ls.kv.Put(loadCtx, fmt.Sprintf("load-%d", g), []byte(fmt.Sprint(i)))
			}
		}(g)
	}
	var leases []*Lease
	for i := 0; i < 16; i++ {
		l, err := ls.Acquire(ctx, fmt.Sprintf("r3-%d", i), int64(i+1), "w")
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	want := ls.cfg.Counters.RenewalsOK.Load() + 16*int64(3*ls.cfg.TTL/ls.cfg.RenewInterval)
	waitFor(t, 45*time.Second, "three TTLs of renewals", func() bool { return ls.cfg.Counters.RenewalsOK.Load() >= want })
	stopLoad()
	within.Group(t, 30*time.Second, &wg, "the load")
	for _, l := range leases {
		if err := l.Check(); err != nil {
			t.Fatalf("lease lost on R3 under load: %v", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("renewals ok %d, failed %d, lost %d", ls.cfg.Counters.RenewalsOK.Load(), ls.cfg.Counters.RenewalsFailed.Load(), ls.cfg.Counters.LeasesLost.Load())
	_ = jetstream.KeyValuePut
}
