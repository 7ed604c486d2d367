package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/flowrun/flow/checkpoint/checkpointtest"
)

// What arrives from outside the process (issue 30): log messages, which anyone allowed
// to publish to flow.log writes, and snapshots, read back from the object store. Both
// fuzzers start from real ones (the random log, which writes every kind of entry, and
// snapshots of its states) and run in CI for a fixed number of inputs (.ci/run).

// fuzzSeedLog is the random log the fuzzers' store is seeded with (its first
// fuzzSeeded messages) and whose later messages seed the corpus: continuations of that
// state, so that most of their entries are accepted. It is the crash tests' log, which
// accepts every kind of entry (checked there).
const (
	fuzzSeedLogSeed = crashLogSeed
	fuzzSeedLogSize = crashLogSize
	fuzzSeeded      = crashLogSize / 2
)

var fuzzBase struct {
	once sync.Once
	fs   *vfs.MemFS // a closed store, "state", that applied the seeded messages
	msgs [][]byte
	err  error
}

// fuzzStore opens a copy of the seeded store.
func fuzzStore(t *testing.T) *Store {
	t.Helper()
	fuzzBase.once.Do(func() {
		fuzzBase.msgs = checkpointtest.RandomLog(fuzzSeedLogSeed, fuzzSeedLogSize)
		fs := vfs.NewCrashableMem()
		s, err := OpenStore("state", StoreOptions{FS: fs})
		if err != nil {
			fuzzBase.err = err
			return
		}
		for i, m := range fuzzBase.msgs[:fuzzSeeded] {
			if _, err := s.Apply(uint64(i+1), m); err != nil {
				fuzzBase.err = err
			}
		}
		// Flushed, so that opening a copy replays no WAL (a fifth of the time of one).
		if err := s.db.Flush(); err != nil && fuzzBase.err == nil {
			fuzzBase.err = err
		}
		if err := s.Close(); err != nil && fuzzBase.err == nil {
			fuzzBase.err = err
		}
		fuzzBase.fs = fs
	})
	if fuzzBase.err != nil {
		t.Fatal(fuzzBase.err)
	}
	s, err := OpenStore("state", StoreOptions{FS: fuzzBase.fs.CrashClone(vfs.CrashCloneCfg{})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// FuzzApply feeds arbitrary bytes, as two log messages, to a store that holds runs in
// every status, by the consumer's path (Store.Apply) and by a writer's own (the message
// decoded beforehand, as logstream's decoder does, then Store.ApplyIfNext), and replays
// an older sequence. Never a panic; a message either stops the applier with
// ErrNewerFormat, changing nothing, or moves the applied sequence by exactly one with a
// verdict for each of its entries, or, if it does not decode, with a recorded
// rejection and no verdicts; a replayed sequence changes nothing; the two stores agree
// on every verdict and dump the same bytes.
func FuzzApply(f *testing.F) {
	msgs := checkpointtest.RandomLog(fuzzSeedLogSeed, fuzzSeedLogSize)
	for i := fuzzSeeded; i+1 < len(msgs); i += 2 {
		f.Add(msgs[i], msgs[i+1], uint8(0))
	}
	for i, m := range undecodable {
		f.Add(msgs[fuzzSeeded], m, uint8(i))
	}
	// The same messages in log format 2 (CBOR; format 3 for those of revision 5), and one
	// of each format after the other.
	for i := fuzzSeeded; i+1 < len(msgs) && i < fuzzSeeded+40; i += 2 {
		var pair [2][]byte
		for j := range pair {
			m, err := DecodeMessage(0, msgs[i+j])
			if err != nil {
				continue
			}
			if pair[j], err = EncodeMessageIn(max(LogFormatBinary, m.Format), m.Node, m.Entries...); err != nil {
				f.Fatal(err)
			}
		}
		if pair[0] != nil && pair[1] != nil {
			f.Add(pair[0], pair[1], uint8(0))
			f.Add(msgs[i], pair[1], uint8(1))
		}
	}
	f.Add([]byte(`{"v":3,"node":"x","entries":[{"k":"cancel","run":"run-1","at":"2026-11-29T02:00:00Z"}]}`), msgs[fuzzSeeded], uint8(1))
	f.Add([]byte(`{"v":2,"node":"x","entries":[{"k":"retire","run":"run-1","term":99,"at":"2026-11-29T02:00:00Z"},{"k":"submit","run":"run-1","submit":{"workflow":"wf0","version":1,"trigger":"manual","max_epochs":1,"steps":[{"name":"a"}]},"at":"2026-11-29T02:00:00Z"}]}`), []byte(`{}`), uint8(2))
	f.Fuzz(func(t *testing.T, first, second []byte, back uint8) {
		a, b := fuzzStore(t), fuzzStore(t)
		for _, m := range [][]byte{first, second} {
			if !fuzzApplyOne(t, a, b, m, back) {
				return // the applier stopped
			}
		}
	})
}

// fuzzApplyOne applies m at the next sequence to a (consumer) and b (writer's own
// message), checks what it must, and reports whether applying goes on.
func fuzzApplyOne(t *testing.T, a, b *Store, m []byte, back uint8) bool {
	seq := a.Applied() + 1
	var before []byte
	if _, err := DecodeEnvelope(seq, m); errors.Is(err, ErrNewerFormat) {
		before = dump(t, a) // it must change nothing
	}
	verdicts, err := a.Apply(seq, m)
	predecoded, _ := DecodeEnvelope(0, m) // logstream's decoder decodes with no sequence
	verdictsB, appliedB, errB := b.ApplyIfNext(seq, m, predecoded)
	if (err == nil) != (errB == nil) || fmt.Sprint(verdicts) != fmt.Sprint(verdictsB) {
		t.Fatalf("message %q at %d: the consumer's apply gives %v %v, the writer's own %v %v", m, seq, verdicts, err, verdictsB, errB)
	}
	if err != nil {
		if !errors.Is(err, ErrNewerFormat) {
			t.Fatalf("message %q at %d stops the applier with %v; only a newer format may (the state is in memory: no storage failure)", m, seq, err)
		}
		if appliedB || a.Applied() != seq-1 || b.Applied() != seq-1 {
			t.Fatalf("message %q of a newer format moved the applied sequence: %d, %d", m, a.Applied(), b.Applied())
		}
		if after := dump(t, a); !bytes.Equal(after, before) {
			t.Fatalf("message %q of a newer format changed the state: %s", m, firstDumpDiff(before, after))
		}
		return false
	}
	if a.Applied() != seq || b.Applied() != seq || !appliedB {
		t.Fatalf("message %q at %d: applied %d and %d (applied by the writer's path: %v), want %d", m, seq, a.Applied(), b.Applied(), appliedB, seq)
	}
	entries, derr := DecodeEnvelope(seq, m)
	var corrupt *CorruptError
	switch {
	case errors.As(derr, &corrupt):
		rejected, rerr := a.RejectedMessages()
		if rerr != nil || len(rejected) == 0 || rejected[len(rejected)-1].Seq != seq || len(verdicts) != 0 {
			t.Fatalf("undecodable message %q at %d: verdicts %v, rejections %v (%v); want none and its rejection recorded", m, seq, verdicts, rejected, rerr)
		}
	case derr != nil:
		t.Fatalf("message %q at %d: applied, yet it decodes with %v", m, seq, derr)
	case len(verdicts) != len(entries):
		t.Fatalf("message %q at %d: %d verdicts for %d entries", m, seq, len(verdicts), len(entries))
	}
	da, db := stateDigest(t, a), stateDigest(t, b)
	if da != db {
		t.Fatalf("message %q at %d: the consumer's and the writer's stores differ: %s", m, seq, firstDumpDiff(dump(t, a), dump(t, b)))
	}
	// A sequence at or below the applied one (a redelivery) changes nothing.
	if old := seq - uint64(back)%seq; back > 0 {
		if v, err := a.Apply(old, m); v != nil || err != nil {
			t.Fatalf("message %q replayed at %d (applied %d): %v %v; want nothing", m, old, seq, v, err)
		}
		if again := stateDigest(t, a); again != da {
			t.Fatalf("message %q replayed at %d changed the state", m, old)
		}
	}
	return true
}

// stateDigest is a SHA-256 of every key and value: what Dump shows, at a fraction of
// its cost (the fuzzers compare states after every input).
func stateDigest(t *testing.T, s *Store) [sha256.Size]byte {
	t.Helper()
	h := sha256.New()
	var n [8]byte
	if err := scan(s.db, nil, nil, func(k, v []byte) (bool, error) {
		for _, b := range [][]byte{k, v} {
			binary.BigEndian.PutUint64(n[:], uint64(len(b)))
			h.Write(n[:])
			h.Write(b)
		}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	return [sha256.Size]byte(h.Sum(nil))
}

// FuzzRestoreSnapshot restores arbitrary bytes as a snapshot; with fixSum set, the
// input's last 32 bytes are first replaced by the SHA-256 of the rest, so that inputs
// reach the parser and the store behind the checksum. Never a panic; a snapshot that is
// refused (ErrBadSnapshot) leaves no state and no half-built one; one that restores
// opens or is refused by OpenStore with an error, and if it opens, its own snapshot
// restores to the same state; a real snapshot (the seeds) restores to a state whose
// snapshot is the same bytes.
func FuzzRestoreSnapshot(f *testing.F) {
	seeds := fuzzSnapshots(f)
	for _, s := range seeds {
		f.Add(s, false)
		f.Add(s[:len(s)/2], false)
		f.Add(s[:len(s)-32], true)
	}
	f.Add([]byte(snapshotMagic+`{"format":1,"seq":7}`+"\n\x00"+`{"format":1,"seq":7}`+"\n"+string(make([]byte, 32))), true)
	f.Add([]byte(snapshotMagic+`{"format":1,"seq":7}`+"\n\x09\x08m/appliedshort\x00"+`{"format":1,"seq":7,"keys":1}`+"\n"+string(make([]byte, 32))), true)
	f.Add([]byte("not a snapshot"), false)
	f.Fuzz(func(t *testing.T, data []byte, fixSum bool) {
		if fixSum && len(data) >= sha256.Size {
			data = bytes.Clone(data)
			sum := sha256.Sum256(data[:len(data)-sha256.Size])
			copy(data[len(data)-sha256.Size:], sum[:])
		}
		fs := vfs.NewMem()
		meta, err := RestoreSnapshot("dst", bytes.NewReader(data), fs)
		if err != nil {
			if !errors.Is(err, ErrBadSnapshot) {
				t.Fatalf("restore: %v; want ErrBadSnapshot (the state is in memory: no storage failure)", err)
			}
			for _, dir := range []string{"dst", "dst.restoring"} {
				if _, serr := fs.Stat(dir); serr == nil {
					t.Fatalf("a refused snapshot (%v) left %s behind", err, dir)
				}
			}
			return
		}
		s, err := OpenStore("dst", StoreOptions{FS: fs})
		if err != nil {
			return // a restored state OpenStore refuses, with an error: a snapshot with the right sum but not of a state (only a crafted one)
		}
		defer s.Close()
		var again bytes.Buffer
		meta2, err := s.WriteSnapshot(&again)
		if err != nil {
			t.Fatalf("the restored state's snapshot: %v", err)
		}
		for _, r := range seeds {
			if bytes.Equal(r, data) && (!bytes.Equal(again.Bytes(), data) || meta2.Seq != meta.Seq) {
				t.Fatalf("a real snapshot at %d, restored, snapshots as different bytes (at %d)", meta.Seq, meta2.Seq)
			}
		}
		if _, err := RestoreSnapshot("dst2", bytes.NewReader(again.Bytes()), fs); err != nil {
			t.Fatalf("the restored state's own snapshot does not restore: %v", err)
		}
		s2, err := OpenStore("dst2", StoreOptions{FS: fs})
		if err != nil {
			t.Fatalf("the restored state's own snapshot, restored, does not open: %v", err)
		}
		defer s2.Close()
		if d1, d2 := dump(t, s), dump(t, s2); !bytes.Equal(d1, d2) {
			t.Fatalf("a snapshot of the restored state restores to another state: %s", firstDumpDiff(d1, d2))
		}
	})
}

// fuzzSnapshots are real snapshots: of an empty state, of the seeded state, of the
// whole random log, and of a state with a log identity.
func fuzzSnapshots(f *testing.F) [][]byte {
	msgs := checkpointtest.RandomLog(fuzzSeedLogSeed, fuzzSeedLogSize)
	s, err := OpenStore("src", StoreOptions{FS: vfs.NewMem()})
	if err != nil {
		f.Fatal(err)
	}
	defer s.Close()
	var out [][]byte
	take := func() {
		var b bytes.Buffer
		if _, err := s.WriteSnapshot(&b); err != nil {
			f.Fatal(err)
		}
		out = append(out, b.Bytes())
	}
	take()
	for i, m := range msgs {
		if _, err := s.Apply(uint64(i+1), m); err != nil {
			f.Fatal(err)
		}
		if i+1 == fuzzSeeded {
			take()
		}
	}
	if err := s.SetLogIdentity("FLOW_LOG@2026-11-29T02:00:00Z"); err != nil {
		f.Fatal(err)
	}
	take()
	return out
}
