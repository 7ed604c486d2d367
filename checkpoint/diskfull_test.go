package checkpoint

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

const diskFullHelperEnv = "FLOW_CHECKPOINT_DISKFULL_HELPER"

func diskFullRun(seq uint64) string { return fmt.Sprintf("m%d", seq) }

// diskFullHelperMain runs in a child process: it applies messages 1..10 to the state in
// the given dir, then the disk "fills" (every write fails with ENOSPC) and it goes on
// applying until Pebble gives up.
func diskFullHelperMain() {
	dir := os.Getenv(diskFullHelperEnv)
	full := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			return fmt.Errorf("injected: %w", syscall.ENOSPC)
		}
		return nil
	})}
	s, err := OpenStore(dir, StoreOptions{FS: errorfs.Wrap(vfs.Default, full)})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(3)
	}
	for seq := uint64(1); seq <= 200; seq++ {
		if seq == 11 {
			full.On()
		}
		results, err := s.Apply(seq, msg(exitOnFatal{}, submitEntry(diskFullRun(seq), StepSpec{Name: "one"})))
		if err != nil {
			fmt.Println("apply-error", seq, err)
			os.Exit(4)
		}
		if len(results) != 1 || results[0] != nil {
			fmt.Println("rejected", seq, results)
			os.Exit(5)
		}
		fmt.Println("applied", seq)
	}
	fmt.Println("no-error")
	os.Exit(6)
}

type exitOnFatal struct{}

func (exitOnFatal) Fatal(args ...any) { fmt.Println(append([]any{"error"}, args...)...); os.Exit(3) }

// A full disk under the state. Pebble treats a failed write of its WAL as fatal and
// panics: the node's process dies with the disk's error (it cannot go on applying, and
// it never turns the failure into an entry's rejection). Once there is room again, a
// restart finds the state whole at some applied sequence (each message's effects and
// its sequence are one batch; the batches were not synced, so that may be an early
// one) and applies the log from there.
func TestDiskFullKillsTheNodeAndLosesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), diskFullHelperEnv+"="+dir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(out.String(), "no space left on device") {
		t.Fatalf("the child applying on a full disk ended with %v; want a panic (exit 2) naming the disk's error:\n%s", err, tailOf(out.String()))
	}
	var lastApplied uint64
	for _, line := range strings.Split(out.String(), "\n") {
		if n, ok := strings.CutPrefix(line, "applied "); ok {
			lastApplied, _ = strconv.ParseUint(n, 10, 64)
		}
	}
	if lastApplied < 10 {
		t.Fatalf("the child applied %d messages before the disk filled; want 10:\n%s", lastApplied, tailOf(out.String()))
	}
	// Room again: the node restarts on the same state.
	s, err := OpenStore(dir, StoreOptions{})
	if err != nil {
		t.Fatalf("reopen after the disk was full: %v", err)
	}
	defer s.Close()
	// The state is committed without waiting for the WAL (the log is the durable
	// record), so how much of it reached the disk before the writes failed is open: as
	// little as nothing. What matters is that it is whole at the sequence it records.
	applied := s.Applied()
	if applied > lastApplied {
		t.Fatalf("applied %d after the restart; the child applied %d in all", applied, lastApplied)
	}
	for seq := uint64(1); seq <= lastApplied; seq++ {
		if _, err := s.Run(diskFullRun(seq)); (seq <= applied) != (err == nil) {
			t.Fatalf("after the restart at applied %d, run %s: %v: the state is not whole at its sequence", applied, diskFullRun(seq), err)
		}
	}
	for seq := applied + 1; seq <= lastApplied+1; seq++ { // the log, replayed from the applied sequence
		if _, err := s.Apply(seq, msg(t, submitEntry(diskFullRun(seq), StepSpec{Name: "one"}))); err != nil {
			t.Fatalf("replay %d with room again: %v", seq, err)
		}
	}
	t.Logf("the child applied %d messages (10 before the disk filled) and died; the restart found the state at %d and caught up", lastApplied, applied)
}

func tailOf(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-15):], "\n")
}
