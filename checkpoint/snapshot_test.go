package checkpoint

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"pgregory.net/rapid"

	"github.com/flowrun/flow/checkpoint/checkpointtest"
)

func dump(t interface{ Fatal(...any) }, s *Store) []byte {
	var b bytes.Buffer
	if err := s.Dump(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// Property: the state restored from a snapshot taken at sequence S, with the log after
// S applied, equals the state built from the whole log, for random logs; the snapshot is
// written while the store goes on applying (it reads the moment it began).
func TestSnapshotPlusTailEqualsTheWholeLog(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		msgs := checkpointtest.RandomLog(rapid.Uint64().Draw(t, "seed"), rapid.IntRange(1, 400).Draw(t, "messages"))
		at := rapid.IntRange(0, len(msgs)).Draw(t, "snapshot at")
		during := rapid.IntRange(0, len(msgs)-at).Draw(t, "applied while writing")
		fs := vfs.NewMem()
		whole, err := OpenStore("whole", StoreOptions{FS: fs})
		if err != nil {
			t.Fatal(err)
		}
		defer whole.Close()
		live, err := OpenStore("live", StoreOptions{FS: fs})
		if err != nil {
			t.Fatal(err)
		}
		defer live.Close()
		for i, m := range msgs {
			if _, err := whole.Apply(uint64(i+1), m); err != nil {
				t.Fatal(err)
			}
		}
		for i := range at {
			if _, err := live.Apply(uint64(i+1), msgs[i]); err != nil {
				t.Fatal(err)
			}
		}
		// The live store applies more as soon as the snapshot's first bytes go out:
		// while it is still reading the state (its buffer is 16 KiB, the state larger).
		var snap bytes.Buffer
		var applyErr error
		w := &onFirstWrite{w: &snap, first: func() {
			for i := at; i < at+during && applyErr == nil; i++ {
				_, applyErr = live.Apply(uint64(i+1), msgs[i])
			}
		}}
		meta, err := live.WriteSnapshot(w)
		if err != nil || applyErr != nil {
			t.Fatal(err, applyErr)
		}
		if meta.Seq != uint64(at) {
			t.Fatalf("snapshot at sequence %d, want %d (taken before the applies during it)", meta.Seq, at)
		}
		restored, err := RestoreSnapshot("restored", &snap, fs)
		if err != nil {
			t.Fatal(err)
		}
		if restored.Seq != meta.Seq {
			t.Fatalf("restored at %d, written at %d", restored.Seq, meta.Seq)
		}
		s, err := OpenStore("restored", StoreOptions{FS: fs})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for i := int(meta.Seq); i < len(msgs); i++ {
			if _, err := s.Apply(uint64(i+1), msgs[i]); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(dump(t, s), dump(t, whole)) {
			t.Fatalf("snapshot at %d plus the log after it differs from the whole log", meta.Seq)
		}
	})
}

// A snapshot that is cut short, corrupted in any byte, or not a snapshot restores
// nothing (ErrBadSnapshot, no state left behind); a crash during a restore leaves a
// half-built folder that the next restore clears.
func TestBadSnapshotsRestoreNothing(t *testing.T) {
	fs := vfs.NewMem()
	s, err := OpenStore("src", StoreOptions{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i, m := range checkpointtest.RandomLog(3, 40) {
		if _, err := s.Apply(uint64(i+1), m); err != nil {
			t.Fatal(err)
		}
	}
	var good bytes.Buffer
	if _, err := s.WriteSnapshot(&good); err != nil {
		t.Fatal(err)
	}
	data := good.Bytes()
	cases := map[string][]byte{
		"empty":      {},
		"not one":    []byte("hello"),
		"truncated":  data[:len(data)/2],
		"no sum":     data[:len(data)-32],
		"last byte":  append(append([]byte(nil), data[:len(data)-1]...), data[len(data)-1]^1),
		"middle bit": append(append(append([]byte(nil), data[:len(data)/2]...), data[len(data)/2]^4), data[len(data)/2+1:]...),
	}
	for name, b := range cases {
		if _, err := RestoreSnapshot("dst", bytes.NewReader(b), fs); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("%s: %v; want ErrBadSnapshot", name, err)
		}
		if _, err := fs.Stat("dst"); err == nil {
			t.Fatalf("%s: a bad snapshot left a state behind", name)
		}
		if _, err := fs.Stat("dst.restoring"); err == nil {
			t.Fatalf("%s: a bad snapshot left its half-built state behind", name)
		}
	}
	// A crash mid-restore: the half-built folder is there; the next restore clears it.
	if err := fs.MkdirAll("dst.restoring", 0o755); err != nil {
		t.Fatal(err)
	}
	f, _ := fs.Create("dst.restoring/junk", vfs.WriteCategoryUnspecified)
	f.Close()
	meta, err := RestoreSnapshot("dst", bytes.NewReader(data), fs)
	if err != nil || meta.Seq != s.Applied() {
		t.Fatalf("restore after a crashed one: %+v %v", meta, err)
	}
	r, err := OpenStore("dst", StoreOptions{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if !bytes.Equal(dump(t, r), dump(t, s)) {
		t.Fatal("the restored state differs from the snapshot's source")
	}
	// A restore never writes over a state.
	if _, err := RestoreSnapshot("dst", bytes.NewReader(data), fs); err == nil {
		t.Fatal("a restore over an existing state succeeded")
	}
}

// onFirstWrite calls first before its first write goes through.
type onFirstWrite struct {
	w     io.Writer
	first func()
	done  bool
}

func (o *onFirstWrite) Write(p []byte) (int, error) {
	if !o.done {
		o.done = true
		o.first()
	}
	return o.w.Write(p)
}
