package logstream

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/checkpoint/checkpointtest"
	"github.com/flowrun/flow/internal/base/natsnode"
	"github.com/flowrun/flow/internal/base/port"
)

const crashHelperEnv = "FLOW_CHECKPOINT_CRASH_HELPER"

// crashHelperMain runs in a child process: it opens the data dir given in the
// environment, applies the log and prints the applied sequence as it moves, until the
// parent SIGKILLs it or it has applied everything.
func crashHelperMain() {
	dir := os.Getenv(crashHelperEnv)
	want, _ := strconv.ParseUint(os.Getenv(crashHelperEnv+"_LAST"), 10, 64)
	fail := func(err error) { fmt.Println("error", err); os.Exit(2) }
	srv, err := natsnode.Start(natsnode.Config{DataDir: filepath.Join(dir, "nats")})
	if err != nil {
		fail(err)
	}
	nc, err := srv.Connect()
	if err != nil {
		fail(err)
	}
	js, _ := jetstream.New(nc)
	store, err := checkpoint.OpenStore(filepath.Join(dir, "state"), checkpoint.StoreOptions{})
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	cfg := DefaultConfig()
	cfg.Stream, cfg.Store, cfg.Node = logStream(js), store, "helper"
	l, err := Open(cfg)
	if err != nil {
		fail(err)
	}
	if err := l.Start(ctx); err != nil {
		fail(err)
	}
	out := bufio.NewWriter(os.Stdout)
	last := uint64(0)
	for {
		if a := store.Applied(); a != last {
			last = a
			fmt.Fprintf(out, "applied %d\n", a)
			out.Flush()
			if a >= want {
				break
			}
		}
		if err := l.Applier.Err(); err != nil {
			fail(err)
		}
		time.Sleep(50 * time.Microsecond) // polling a counter to report progress, not to synchronise
	}
	l.Stop()
	store.Close()
	nc.Close()
	srv.Shutdown()
	fmt.Fprintln(out, "done")
	out.Flush()
	os.Exit(0)
}

// replayDump applies msgs[0:upTo] to a fresh store that records the log identity id
// and dumps it.
func replayDump(t *testing.T, msgs [][]byte, upTo uint64, id string) []byte {
	t.Helper()
	s := memStore(t)
	if id != "" {
		if err := s.SetLogIdentity(id); err != nil {
			t.Fatal(err)
		}
	}
	for i := uint64(0); i < upTo; i++ {
		if _, err := s.Apply(i+1, msgs[i]); err != nil {
			t.Fatal(err)
		}
	}
	var b bytes.Buffer
	if err := s.Dump(&b); err != nil {
		t.Fatal(err)
	}
	s.Close()
	return b.Bytes()
}

func dumpDir(t *testing.T, dir string) ([]byte, uint64, string) {
	t.Helper()
	s, err := checkpoint.OpenStore(dir, checkpoint.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var b bytes.Buffer
	if err := s.Dump(&b); err != nil {
		t.Fatal(err)
	}
	id, err := s.LogIdentity()
	if err != nil {
		t.Fatal(err)
	}
	return b.Bytes(), s.Applied(), id
}

// TestCrashDuringApply SIGKILLs a process applying a long log at random points, 20
// times; after each kill the state it left equals a clean replay of the log up to the
// sequence it says it applied, and the next start carries on from there.
func TestCrashDuringApply(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 21 processes")
	}
	dir := t.TempDir()
	const total = 1500
	msgs := checkpointtest.RandomLog(42, total)
	{ // write the log
		env := startEnv(t, dir)
		env.closeLog()
		for i, m := range msgs {
			ack, err := env.js.Publish(ctxT(t), port.LogSubject, m)
			if err != nil || ack.Sequence != uint64(i+1) {
				t.Fatalf("publish %d: %v %+v", i, err, ack)
			}
		}
		env.close()
		os.RemoveAll(filepath.Join(dir, "state"))
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	kills := 0
	for round := 0; round < 21; round++ {
		_, from := dumpDirApplied(t, dir)
		// Each helper's life has a deadline: past it the helper is killed, its output
		// ends and the round fails on its state.
		hctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(hctx, exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), crashHelperEnv+"="+dir, crashHelperEnv+"_LAST="+strconv.Itoa(total))
		stdout, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		target := from + 1 + uint64(rng.IntN(total/25))
		last := round == 20
		sc := bufio.NewScanner(stdout)
		killed := false
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "error") {
				t.Fatalf("helper: %s", line)
			}
			var a uint64
			if _, err := fmt.Sscanf(line, "applied %d", &a); err == nil && !last && a >= target {
				_ = cmd.Process.Signal(syscall.SIGKILL)
				killed = true
				break
			}
		}
		_ = cmd.Wait()
		cancel()
		if hctx.Err() == context.DeadlineExceeded {
			t.Fatalf("round %d: the helper did not end within its deadline", round)
		}
		if killed {
			kills++
		}
		got, applied, id := dumpDir(t, filepath.Join(dir, "state"))
		if want := replayDump(t, msgs, applied, id); !bytes.Equal(got, want) {
			t.Fatalf("round %d: state after kill at applied=%d differs from a clean replay", round, applied)
		}
		if last && applied != total {
			t.Fatalf("final run applied %d of %d", applied, total)
		}
	}
	if kills < 15 {
		t.Fatalf("only %d of 20 rounds were killed mid-apply; the test did not test crashes", kills)
	}
}

func dumpDirApplied(t *testing.T, dir string) ([]byte, uint64) {
	st := filepath.Join(dir, "state")
	if _, err := os.Stat(st); err != nil {
		return nil, 0
	}
	dump, applied, _ := dumpDir(t, st)
	return dump, applied
}
