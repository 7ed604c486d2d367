package checkpoint

import (
	"os"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.uber.org/goleak"

	"github.com/flowrun/flow/internal/base/testhooks"
)

func TestMain(m *testing.M) {
	if os.Getenv(diskFullHelperEnv) != "" {
		diskFullHelperMain()
		return
	}
	goleak.VerifyTestMain(m)
}

// memStore is a real Pebble on an in-memory file system.
func memStore(t testing.TB, h *testhooks.Hooks) *Store {
	t.Helper()
	s, err := OpenStore("state", StoreOptions{FS: vfs.NewMem(), Hooks: h})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// msg encodes entries as one log message.
func msg(t interface{ Fatal(...any) }, entries ...Entry) []byte {
	b, err := EncodeMessage("test", entries...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// applyOne applies one entry as its own message at the next sequence.
func applyOne(t testing.TB, s *Store, e Entry) (uint64, error) {
	t.Helper()
	seq := s.Applied() + 1
	res, err := s.Apply(seq, msg(t, e))
	if err != nil {
		t.Fatalf("apply %s at %d: %v", e.Kind, seq, err)
	}
	return seq, res[0]
}

func mustApply(t testing.TB, s *Store, e Entry) uint64 {
	t.Helper()
	seq, err := applyOne(t, s, e)
	if err != nil {
		t.Fatalf("apply %s at %d: %v", e.Kind, seq, err)
	}
	return seq
}

var t0 = time.Date(2026, 11, 29, 2, 0, 0, 0, time.UTC)

func submitEntry(run string, steps ...StepSpec) Entry {
	return Entry{Kind: KindSubmit, Run: run, At: t0, Submit: &Submit{
		Workflow: "wf", Version: 1, Trigger: TriggerManual, MaxEpochs: 3, Steps: steps,
	}}
}

func memFS() vfs.FS { return vfs.NewMem() }
