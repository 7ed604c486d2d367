package checkpoint

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// sstReadsFail is a file system whose reads of sstables fail while it is on: a disk
// that returns EIO for the state's older data (what was flushed), while the memtable,
// the WAL and the store's cache of runs still answer.
func sstReadsFail() (*errorfs.FS, *errorfs.Toggle) {
	toggle := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		if (op.Kind == errorfs.OpFileReadAt || op.Kind == errorfs.OpFileRead) && strings.HasSuffix(op.Path, ".sst") {
			return errorfs.ErrInjected
		}
		return nil
	})}
	return errorfs.Wrap(vfs.NewMem(), toggle), toggle
}

// A read that fails while a message is applied stops the applier (ErrStorage) and
// changes nothing, wherever the read is: the keys a retire deletes (scanned through
// the batch), a run read to record a stale-term rejection on it. Found by
// TestFaultAtEveryOperation (issue 30): both errors were dropped, and the message was
// applied as if the keys that could not be read did not exist (a retire left the run's
// events behind; a stale-term rejection lost its event), a state no other node has.
func TestReadFailuresDuringApplyStopTheApplier(t *testing.T) {
	for _, c := range []struct {
		name  string
		entry func(s *Store) Entry // the message that meets the failing reads
		// cached: the run is in the applier's cache when the reads fail (its record
		// is not read; what the entry scans is).
		cached bool
	}{
		{name: "retire scans the run's keys", cached: true,
			entry: func(s *Store) Entry { return Entry{Kind: KindRetire, Run: "r", Term: 2, At: t0} }},
		{name: "stale term reads the run",
			entry: func(s *Store) Entry { return Entry{Kind: KindAssign, Run: "r", Term: 1, At: t0} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs, toggle := sstReadsFail()
			s, err := OpenStore("state", StoreOptions{FS: fs})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ref := memStore(t, nil) // the same log on a well disk: what every other node has
			apply := func(e Entry) uint64 {
				t.Helper()
				m := EncodeJSONEnvelope("test", RevisionFor(e.Kind), [][]byte{mustJSON(t, e)})
				seq := s.Applied() + 1
				for _, st := range []*Store{s, ref} {
					if _, err := st.Apply(seq, m); err != nil {
						t.Fatal(err)
					}
				}
				return seq
			}
			// A state of many blocks: the run's foreach items (what a retire scans) and,
			// after its record (what a rejection reads), workflow versions, each 1 KiB
			// that does not compress.
			rng := rand.New(rand.NewPCG(1, 1))
			noise := func() json.RawMessage {
				b := make([]byte, 512)
				for i := range b {
					b[i] = byte(rng.Uint32())
				}
				return json.RawMessage(strconv.Quote(hex.EncodeToString(b)))
			}
			apply(submitEntry("r", StepSpec{Name: "b", Foreach: true}))
			seq := apply(Entry{Kind: KindAssign, Run: "r", Term: 2, Worker: "w", At: t0})
			for i := range 150 {
				apply(Entry{Kind: KindCommit, Run: "r", Epoch: int64(seq), Owner: "w", Step: "b", Item: i, Output: noise(), At: t0})
				apply(Entry{Kind: KindWorkflow, Workflow: &WorkflowDef{Name: "wf", Digest: fmt.Sprint(i), Spec: noise()}, At: t0})
			}
			apply(Entry{Kind: KindCancel, Run: "r", Reason: "operator", At: t0})
			if !c.cached {
				s.dropCache()
			}
			// Flushed: what the message reads is in an sstable that no read has brought
			// into Pebble's block cache yet (so nothing here reads s before the fault).
			if err := s.db.Flush(); err != nil {
				t.Fatal(err)
			}
			applied := s.Applied()
			e := c.entry(s)
			m := EncodeJSONEnvelope("test", RevisionFor(e.Kind), [][]byte{mustJSON(t, e)})
			toggle.On()
			_, err = s.Apply(applied+1, m)
			toggle.Off()
			if !errors.Is(err, ErrStorage) {
				t.Fatalf("%s with the state's reads failing: %v; want ErrStorage (the applier stops)", e.Kind, err)
			}
			if s.Applied() != applied {
				t.Fatalf("applied moved to %d past a failed apply", s.Applied())
			}
			if got, want := dump(t, s), dump(t, ref); !bytes.Equal(got, want) {
				t.Fatalf("the failed apply changed the state: %s", firstDumpDiff(want, got))
			}
			// With the disk well again, the node applies the message as the others do.
			for _, st := range []*Store{s, ref} {
				if _, err := st.Apply(applied+1, m); err != nil {
					t.Fatalf("the message again, the disk well: %v", err)
				}
			}
			if got, want := dump(t, s), dump(t, ref); !bytes.Equal(got, want) {
				t.Fatalf("after the message, applied with the disk well: %s", firstDumpDiff(want, got))
			}
		})
	}
}
