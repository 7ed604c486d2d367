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

	"github.com/flowrun/flow/internal/natsnode"
)

// The TTL trade-off, measured with our own pause simulation (docs/leases.md): a lease
// holder in its own process is SIGSTOPped for a fraction of the TTL and resumed; did it
// lose its lease (a false expiry: it was alive)? And after a SIGKILL, how long until a
// newer epoch's acquire succeeds (the recovery time)? Run with FLOW_LEASE_SIM=1 (about four minutes).

func leaseHelperMain() {
	ttl, _ := time.ParseDuration(os.Getenv(helperEnv + "_TTL"))
	nc, err := natsnode.Connect(os.Getenv(helperEnv+"_URL"), "holder")
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	ls, err := NewLeases(ctx, js, Config{TTL: ttl}, 1)
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

func TestLeaseTTLTradeoff(t *testing.T) {
	if os.Getenv("FLOW_LEASE_SIM") == "" {
		t.Skip("a measurement, not a test: run with FLOW_LEASE_SIM=1 (takes about two minutes)")
	}
	srv := startNATS(t)
	_, js := connect(t, srv.ClientURL())
	exe, _ := os.Executable()
	fractions := []float64{0.2, 0.3, 0.4, 0.5, 0.6, 0.75, 1.0}
	reps := 4
	fmt.Printf("| TTL | pause/TTL | leases lost (of %d) | recovery after SIGKILL (median) |\n|---|---|---|---|\n", reps)
	for _, ttl := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		ls, err := NewLeases(context.Background(), js, Config{TTL: ttl}, 1)
		if err != nil {
			t.Fatal(err)
		}
		watcher, err := ls.Watch(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var recoveries []time.Duration
		for _, f := range fractions {
			lost := 0
			for r := 0; r < reps; r++ {
				run := fmt.Sprintf("sim-%s-%v-%d", ttl, f, r)
				cmd := exec.Command(exe, "-test.run=^$")
				cmd.Env = append(os.Environ(), helperEnv+"=sim", helperEnv+"_MODE=lease", helperEnv+"_URL="+srv.ClientURL(),
					helperEnv+"_TTL="+ttl.String(), helperEnv+"_RUN="+run)
				out, _ := cmd.StdoutPipe()
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				lines := make(chan string, 8)
				go func() {
					sc := bufio.NewScanner(out)
					for sc.Scan() {
						lines <- sc.Text()
					}
					close(lines)
				}()
				if l := <-lines; l != "held" {
					t.Fatalf("helper: %s", l)
				}
				// Pause at a random point of the renewal cycle, as a GC pause would.
				time.Sleep(ttl/3 + time.Duration(r)*ttl/(3*time.Duration(reps))) // placing the pause in the cycle, not synchronising
				_ = cmd.Process.Signal(syscall.SIGSTOP)
				time.Sleep(time.Duration(float64(ttl) * f)) // the simulated pause itself
				_ = cmd.Process.Signal(syscall.SIGCONT)
				survived := false
				select {
				case l := <-lines:
					if strings.HasPrefix(l, "lost") {
						lost++
					}
				case <-time.After(ttl): // a TTL after resuming and still held: survived
					survived = true
				}
				// Recovery: kill it; the leader's watcher reports the lapse, and a newer
				// epoch's acquire follows.
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				killed := time.Now()
				for ev := range watcher.Events() {
					if ev.Lease.Run == run {
						break
					}
				}
				l, err := ls.Acquire(context.Background(), run, 2, "next")
				if err != nil {
					t.Fatal(err)
				}
				if survived { // a healthy holder killed: the crash case
					recoveries = append(recoveries, time.Since(killed))
				}
				_ = l.Release(context.Background())
				for ev := range watcher.Events() { // its release
					if ev.Lease.Run == run {
						break
					}
				}
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
