package epoch

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/internal/base/natsnode"
	"github.com/flowrun/flow/internal/testkit/within"
)

// The TTL trade-off (docs/leases.md): a lease holder in its own process is SIGSTOPped for
// a fraction of the TTL and resumed; did it lose its lease (a false expiry: it was alive)?
// And after a SIGKILL, how long until a newer epoch's acquire succeeds (the recovery time)?
//
// By default it checks the two ends the docs promise, which the trust window decides: a
// pause well under TTL/3 never costs the lease, a pause past 2/3 TTL always does. With
// FLOW_LEASE_SIM=1 it measures the whole table instead (about four minutes).

func leaseHelperMain() {
	ttl, _ := time.ParseDuration(os.Getenv(helperEnv + "_TTL"))
	nc, err := natsnode.Connect(os.Getenv(helperEnv+"_URL"), "holder")
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	ls, err := newLeases(ctx, js, Config{TTL: ttl}, 1)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	l, err := ls.Acquire(ctx, os.Getenv(helperEnv+"_RUN"), 1, "holder")
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	fmt.Println("held")
	<-l.Done()
	fmt.Println("lost", l.Err())
	select {}
}

// pausedHolder is one lease holder in a child process of this test binary.
type pausedHolder struct {
	cmd   *exec.Cmd
	lines chan string
}

// startHolder starts a child that acquires the lease of run with ttl and reports on stdout.
func startHolder(t *testing.T, url string, ttl time.Duration, run string) *pausedHolder {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=sim", helperEnv+"_MODE=lease", helperEnv+"_URL="+url,
		helperEnv+"_TTL="+ttl.String(), helperEnv+"_RUN="+run)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &pausedHolder{cmd: cmd, lines: make(chan string, 8)}
	t.Cleanup(func() { h.kill(t) })
	go func() { // ends when the child's stdout closes (it exits or is killed)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		close(h.lines)
	}()
	select {
	case l := <-h.lines:
		if l != "held" {
			t.Fatalf("lease holder: %q", l)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the lease holder did not take its lease within 20s")
	}
	return h
}

func (h *pausedHolder) kill(t *testing.T) {
	_ = h.cmd.Process.Signal(syscall.SIGCONT)
	_ = h.cmd.Process.Kill()
	_ = within.Cmd(t, 30*time.Second, h.cmd, "the lease holder after its SIGKILL")
	deadline := time.After(30 * time.Second)
	for open := true; open; { // drained: the reader goroutine has ended
		select {
		case _, open = <-h.lines:
		case <-deadline:
			t.Fatal("the killed holder's output did not end within 30s")
		}
	}
}

// pause SIGSTOPs the holder for f of the TTL, at offset into its renewal cycle after it
// took the lease, resumes it, and reports whether it lost its lease: a holder that lost
// it says so as soon as it wakes (its kill switch), and one that kept it renews it. The
// test polls the key (every 20 ms, up to two TTLs) for a renewal written after the
// resume.
func (h *pausedHolder) pause(t *testing.T, js jetstream.JetStream, run string, ttl, offset time.Duration, f float64) (lost bool) {
	t.Helper()
	time.Sleep(offset) // placing the pause in the renewal cycle, not synchronising
	_ = h.cmd.Process.Signal(syscall.SIGSTOP)
	time.Sleep(time.Duration(float64(ttl) * f)) // the simulated pause itself
	_ = h.cmd.Process.Signal(syscall.SIGCONT)
	ctx, cancel := context.WithTimeout(context.Background(), 2*ttl)
	defer cancel()
	resumed, err := latestOf(ctx, js, LeaseBucket, run) // the key as it stood at the resume, or later
	if err != nil {
		t.Fatal(err)
	}
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case l := <-h.lines:
			return strings.HasPrefix(l, "lost")
		case <-poll.C:
			if cur, err := latestOf(ctx, js, LeaseBucket, run); err == nil && cur.found && !cur.deleted && cur.rev > resumed.rev {
				return false // renewed after the resume: kept
			}
		case <-ctx.Done():
			t.Fatalf("the holder neither renewed nor said it lost its lease within %s of resuming", 2*ttl)
		}
	}
}

func TestLeaseTTLTradeoff(t *testing.T) {
	if os.Getenv("FLOW_LEASE_SIM") != "" {
		measureLeaseTTLTradeoff(t)
		return
	}
	if testing.Short() {
		t.Skip("pauses lease holders in child processes for about 8 s")
	}
	srv := startNATS(t)
	_, js := connect(t, srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ttl = 2 * time.Second
	if _, err := newLeases(ctx, js, Config{TTL: ttl}, 1); err != nil { // the bucket, to watch it
		t.Fatal(err)
	}
	// Each pause starts right after a renewal the test sees land on the server, plus
	// offset: a pause of 0.75 TTL then ends before the key could lapse on the server, so
	// only the holder's trust window (2/3 TTL after its last renewal was sent) can cost it
	// the lease; a pause of 0.15 TTL, at the start or in the middle of the renewal cycle
	// (TTL/3), does not. Every other pause and offset is TestPauseCostsTheLeaseOnlyPastTheTrustWindow's,
	// on a fake clock: this test checks what that one assumes, that a stopped process's
	// clock runs on and the holder notices on waking.
	for _, c := range []struct {
		f      float64
		offset time.Duration
		lost   bool
	}{{0.15, 0, false}, {0.15, ttl / 6, false}, {0.75, 0, true}} {
		run := fmt.Sprintf("check-%v-%s", c.f, c.offset)
		kv, err := js.KeyValue(ctx, LeaseBucket)
		if err != nil {
			t.Fatal(err)
		}
		w, err := kv.Watch(ctx, run, jetstream.UpdatesOnly())
		if err != nil {
			t.Fatal(err)
		}
		h := startHolder(t, srv.ClientURL(), ttl, run)
		renewals := 0
		for renewals < 2 { // the acquire's create, then a renewal
			select {
			case e := <-w.Updates():
				if e != nil {
					renewals++
				}
			case <-time.After(2 * ttl):
				t.Fatalf("no renewal of %s seen within %s", run, 2*ttl)
			}
		}
		_ = w.Stop()
		if lost := h.pause(t, js, run, ttl, c.offset, c.f); lost != c.lost {
			t.Fatalf("a pause of %.2f TTL (TTL %s) %s after a renewal: lease lost = %v, want %v (kept below TTL/3, lost past 2/3 TTL)", c.f, ttl, c.offset, lost, c.lost)
		}
		h.kill(t)
	}
}

// measureLeaseTTLTradeoff prints the table of docs/leases.md.
func measureLeaseTTLTradeoff(t *testing.T) {
	srv := startNATS(t)
	_, js := connect(t, srv.ClientURL())
	fractions := []float64{0.2, 0.3, 0.4, 0.5, 0.6, 0.75, 1.0}
	reps := 4
	fmt.Printf("| TTL | pause/TTL | leases lost (of %d) | recovery after SIGKILL (median) |\n|---|---|---|---|\n", reps)
	for _, ttl := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		ls, err := newLeases(context.Background(), js, Config{TTL: ttl}, 1)
		if err != nil {
			t.Fatal(err)
		}
		watcher, err := ls.Watch(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		event := func(run string) {
			deadline := time.After(10 * ttl)
			for {
				select {
				case ev := <-watcher.Events():
					if ev.Lease.Run == run {
						return
					}
				case <-deadline:
					t.Fatalf("no lease event for %s within %s", run, 10*ttl)
				}
			}
		}
		var recoveries []time.Duration
		for _, f := range fractions {
			lost := 0
			for r := 0; r < reps; r++ {
				run := fmt.Sprintf("sim-%s-%v-%d", ttl, f, r)
				h := startHolder(t, srv.ClientURL(), ttl, run)
				// Pause at a random point of the renewal cycle, as a GC pause would.
				survived := !h.pause(t, js, run, ttl, ttl/3+time.Duration(r)*ttl/(3*time.Duration(reps)), f)
				if !survived {
					lost++
				}
				// Recovery: kill it; the leader's watcher reports the lapse, and a newer
				// epoch's acquire follows.
				h.kill(t)
				killed := time.Now()
				event(run)
				l, err := ls.Acquire(context.Background(), run, 2, "next")
				if err != nil {
					t.Fatal(err)
				}
				if survived { // a healthy holder killed: the crash case
					recoveries = append(recoveries, time.Since(killed))
				}
				_ = l.Release(context.Background())
				event(run) // its release
			}
			fmt.Printf("| %s | %.2f | %d |", ttl, f, lost)
			if f == fractions[len(fractions)-1] && len(recoveries) > 0 {
				fmt.Printf(" %s (max %s, of %d) |\n", median(recoveries).Round(10*time.Millisecond),
					slices.Max(recoveries).Round(10*time.Millisecond), len(recoveries))
			} else {
				fmt.Printf(" |\n")
			}
		}
		watcher.Stop()
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
