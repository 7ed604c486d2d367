package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/record"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/flowrun/flow/checkpoint/checkpointtest"
)

// Crashes and faults at every operation (issue 30). Apply commits without fsync (the
// log is the durable copy), so a SIGKILL, which keeps the page cache, never shows what a
// power loss does: unsynced batches lost. These tests run each phase of a store's life
// (applying, with undecodable messages among the log's; rejections alone; the
// newest-first index build at open; a restore from a snapshot and what follows) on
// Pebble's crashable memory file system, and before every file-system operation of the
// phase, and at every message boundary, take the file systems a crash there may leave
// (vfs.MemFS.CrashClone): only what was synced (a power loss), all that was written (a
// process death), and what was synced with the WAL torn after each batch written since
// its last sync, then reopen the store from each. And they run the phase again for
// i = 1, 2, ... with an error injected at the i-th operation (vfs/errorfs), until a run
// completes untouched, as Pebble's TestMarker_FaultTolerance does: the process that met
// the error counts as dead, and the store is reopened from what it left, as it was and
// after a power loss.
//
// After each: the store opens (a restore's crash may leave no state, and the node
// restores again, as logstream.PrepareState does; never a state below the snapshot);
// its state is exactly a replay of messages 1..Applied() into a fresh store (Store.Dump,
// byte for byte: runs, steps, events, indexes, rejections, the applied sequence); and
// the rest of the log brings it to the state of the uncrashed store. A failure names
// the operation (its index, kind and file), what the phase was doing (the message it was
// applying) and what survived the crash.
//
// The negative controls were run by hand, each a change to apply.go, store.go,
// newest.go or snapshot.go tried in the worktree and reverted: the applied sequence
// committed in a batch of its own after the state's (a crash between the two: the state
// ahead of the sequence it says it applied), a rejection's record and its sequence in
// two batches, m/index-newest set in the index build's first batch instead of its last,
// a restore built in place: each fails TestCrashAtEveryOperation (the last two
// TestFaultAtEveryOperation too), with the samples of -short and -race as well
// (docs/testing.md).

// crashLogSize is how many messages the crash tests' log holds: the random log of seed
// crashLogSeed, which accepts every kind of entry by then (checked).
const (
	crashLogSize = 96
	crashLogSeed = 45
)

// undecodable are messages the state rejects as a whole (the rejection path), put among
// the random log's.
var undecodable = [][]byte{
	[]byte("not json"),
	[]byte(`{"v":1,"node":"x","entries":[]}`),
	[]byte(`{"v":1,"node":"x","entries":[{"k":"nope","at":"2026-11-29T02:00:00Z"}]}`),
	[]byte(`{"v":1,"node":"x","entries":[{"k":"retire","run":"run-1","term":1,"at":"2026-11-29T02:00:00Z"}]}`), // retire is format 2
	[]byte(`{"v":1,"node":"x","entries":[{"k":"cancel","run":"run-1","at":"2026-11-29T02:00:00Z"}]} trailing`),
}

// crashLog is the log the crash tests apply: a random log with every kind of entry and
// undecodable messages among it, and the dump of a fresh store after each prefix of it
// (refs[k]: messages 1..k).
type crashLog struct {
	msgs [][]byte
	refs [][]byte
}

var (
	crashLogOnce sync.Once
	theCrashLog  crashLog
	crashLogErr  error
)

func getCrashLog(t *testing.T) *crashLog {
	t.Helper()
	// Index builds of many batches (a build cut short leaves some of them).
	old := indexBuildBatch
	t.Cleanup(func() { indexBuildBatch = old })
	indexBuildBatch = 7
	crashLogOnce.Do(func() {
		msgs := checkpointtest.RandomLog(crashLogSeed, crashLogSize)
		for i, at := range []int{4, 20, 21, 44, 52} {
			msgs[at] = undecodable[i]
		}
		s, err := OpenStore("ref", StoreOptions{FS: vfs.NewMem()})
		if err != nil {
			crashLogErr = err
			return
		}
		defer s.Close()
		refs := [][]byte{dumpBytes(s)}
		accepted := map[string]int{}
		for i, m := range msgs {
			verdicts, err := s.Apply(uint64(i+1), m)
			if err != nil {
				crashLogErr = err
				return
			}
			refs = append(refs, dumpBytes(s))
			entries, _ := DecodeEnvelope(uint64(i+1), m)
			for j := range verdicts {
				if verdicts[j] == nil {
					accepted[string(entries[j].Kind)]++
					accepted[facet(entries[j])]++
				}
			}
		}
		if n := len(mustRejected(s)); n != 5 {
			crashLogErr = fmt.Errorf("the crash log's store rejected %d messages, want 5", n)
		}
		for _, k := range everyKind() {
			if accepted[k] == 0 && !strings.HasPrefix(k, "a ") { // the effects: TestCrashLogCoversEveryKind

				crashLogErr = fmt.Errorf("the crash log (seed %d, %d messages) accepts no %s entry: pick a seed whose log has every kind (accepted: %v)", crashLogSeed, crashLogSize, k, accepted)
			}
		}
		theCrashLog = crashLog{msgs: msgs, refs: refs}
	})
	if crashLogErr != nil {
		t.Fatal(crashLogErr)
	}
	return &theCrashLog
}

func dumpBytes(s *Store) []byte {
	var b bytes.Buffer
	if err := s.Dump(&b); err != nil {
		return []byte("dump failed: " + err.Error())
	}
	return b.Bytes()
}

func mustRejected(s *Store) []RejectedMessage {
	r, _ := s.RejectedMessages()
	return r
}

// crashPhase is a part of a store's life walked for crashes and faults.
type crashPhase struct {
	name string
	// prepare builds the state the phase starts from (nil: none), on a file system the
	// walks do not touch.
	prepare func(fs vfs.FS) error
	// run is the phase. It reports what it is doing through at (a message boundary is a
	// crash point too), and must close what it opened whatever happens, a panic too.
	run func(fs vfs.FS, at func(stage string)) error
	// minApplied is the least applied sequence a crash may leave (what prepare
	// synced, or the snapshot a restore starts from).
	minApplied uint64
	// snapshot, if set, is restored when a crash leaves no state (the node restores
	// the newest snapshot again, as logstream.PrepareState does).
	snapshot []byte
}

// closeStore closes s (if a store was opened) as a phase's deferred cleanup: the error
// of the phase wins, and a panic of Pebble's close (after an injected fault) is the
// phase's error.
func closeStore(s *Store, err *error) {
	if s == nil {
		return
	}
	defer func() {
		if r := recover(); r != nil && *err == nil {
			*err = fmt.Errorf("close panicked: %v", r)
		}
	}()
	if cerr := s.Close(); *err == nil {
		*err = cerr
	}
}

// applyRange applies msgs[from:to] at their sequences, flushing the memtable after each
// message in flushAfter (a flush syncs an sstable and the manifest and rotates the
// WAL: the points where part of the applied log becomes durable).
func applyRange(s *Store, msgs [][]byte, from, to int, at func(string), flushAfter ...int) error {
	for i := from; i < to; i++ {
		at(fmt.Sprintf("applying message %d", i+1))
		if _, err := s.Apply(uint64(i+1), msgs[i]); err != nil {
			return err
		}
		at(fmt.Sprintf("after message %d", i+1))
		if slices.Contains(flushAfter, i+1) {
			at(fmt.Sprintf("flushing after message %d", i+1))
			if err := s.db.Flush(); err != nil {
				return err
			}
		}
	}
	return nil
}

func crashPhases(t *testing.T, log *crashLog) []crashPhase {
	msgs := log.msgs
	const half = crashLogSize / 2
	// The snapshot a restore starts from: the state after the first half.
	src, err := OpenStore("src", StoreOptions{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	if err := applyRange(src, msgs, 0, half, func(string) {}); err != nil {
		t.Fatal(err)
	}
	var snap bytes.Buffer
	if _, err := src.WriteSnapshot(&snap); err != nil {
		t.Fatal(err)
	}
	src.Close()
	open := func(fs vfs.FS, at func(string)) (*Store, error) {
		at("opening")
		return OpenStore("state", StoreOptions{FS: fs})
	}
	return []crashPhase{{
		// The applier from an empty state: apply (rejections among the messages),
		// flushes, a restart, more applies.
		name: "apply",
		run: func(fs vfs.FS, at func(string)) (err error) {
			s, err := open(fs, at)
			if err != nil {
				return err
			}
			defer func() { closeStore(s, &err) }()
			if err := applyRange(s, msgs, 0, half, at, 12, 24); err != nil {
				return err
			}
			at("closing")
			if err := s.Close(); err != nil {
				return err
			}
			if s, err = open(fs, at); err != nil {
				return err
			}
			return applyRange(s, msgs, half, crashLogSize, at, 44)
		},
	}, {
		// Only undecodable messages: each a rejection batch (j/<seq>, the applied
		// sequence, m/index-newest) on a state that holds runs.
		name: "rejections",
		prepare: func(fs vfs.FS) (err error) {
			s, err := OpenStore("state", StoreOptions{FS: fs})
			if err != nil {
				return err
			}
			defer closeStore(s, &err)
			return applyRange(s, msgs, 0, 20, func(string) {})
		},
		minApplied: 20,
		run: func(fs vfs.FS, at func(string)) (err error) {
			s, err := open(fs, at)
			if err != nil {
				return err
			}
			defer func() { closeStore(s, &err) }()
			return applyRange(s, msgs, 20, 22, at, 21) // messages 21 and 22 do not decode
		},
	}, {
		// A state of an older flowd (no newest-first index): the build at open, in
		// batches of 7 keys, then applies; "done again at the next open" if cut short.
		name: "index build",
		prepare: func(fs vfs.FS) (err error) {
			s, err := OpenStore("state", StoreOptions{FS: fs})
			if err != nil {
				return err
			}
			defer closeStore(s, &err)
			if err := applyRange(s, msgs, 0, half, func(string) {}); err != nil {
				return err
			}
			stripNewestIndex(failOnFatal{&err}, s)
			return err
		},
		minApplied: half,
		run: func(fs vfs.FS, at func(string)) (err error) {
			s, err := open(fs, at) // builds the index
			if err != nil {
				return err
			}
			defer func() { closeStore(s, &err) }()
			at("flushing the built index")
			if err := s.db.Flush(); err != nil {
				return err
			}
			return applyRange(s, msgs, half, half+8, at)
		},
	}, {
		// A new node: the snapshot at the first half restored, then the log after it.
		name:       "restore",
		snapshot:   snap.Bytes(),
		minApplied: half,
		run: func(fs vfs.FS, at func(string)) (err error) {
			at("restoring")
			if _, err := RestoreSnapshot("state", bytes.NewReader(snap.Bytes()), fs); err != nil {
				return err
			}
			s, err := open(fs, at)
			if err != nil {
				return err
			}
			defer func() { closeStore(s, &err) }()
			return applyRange(s, msgs, half, half+10, at, half+5)
		},
	}}
}

// failOnFatal turns stripNewestIndex's Fatal into an error.
type failOnFatal struct{ err *error }

func (f failOnFatal) Fatal(args ...any) { *f.err = errors.New(fmt.Sprint(args...)) }

// check reopens the store from a file system a crash or a fault left and compares it
// with the replay of the log, then applies the rest of the log.
func (p *crashPhase) check(log *crashLog, fs vfs.FS) (applied uint64, err error) {
	if _, serr := fs.Stat("state"); serr != nil && p.snapshot == nil && p.minApplied > 0 {
		return 0, fmt.Errorf("no state left at all: %v", serr)
	} else if serr != nil && p.snapshot != nil {
		// The crash came before the restore's rename was durable: the node restores the
		// snapshot again. A half-built state.restoring is cleared by it.
		if _, err := RestoreSnapshot("state", bytes.NewReader(p.snapshot), fs); err != nil {
			return 0, fmt.Errorf("restore again after the crash left no state: %w", err)
		}
	}
	s, err := OpenStore("state", StoreOptions{FS: fs})
	if err != nil {
		return 0, fmt.Errorf("reopen: %w", err)
	}
	defer s.Close()
	applied = s.Applied()
	if applied < p.minApplied || applied > uint64(len(log.msgs)) {
		return applied, fmt.Errorf("reopened at applied %d, outside [%d, %d]", applied, p.minApplied, len(log.msgs))
	}
	if got := dumpBytes(s); !bytes.Equal(got, log.refs[applied]) {
		return applied, fmt.Errorf("reopened at applied %d, its state differs from a replay of messages 1..%d: %s",
			applied, applied, firstDumpDiff(log.refs[applied], got))
	}
	for i := int(applied); i < len(log.msgs); i++ {
		if _, err := s.Apply(uint64(i+1), log.msgs[i]); err != nil {
			return applied, fmt.Errorf("reopened at applied %d, applying message %d: %w", applied, i+1, err)
		}
	}
	if got := dumpBytes(s); !bytes.Equal(got, log.refs[len(log.msgs)]) {
		return applied, fmt.Errorf("reopened at applied %d, the rest of the log gives a state that differs from the uncrashed store's: %s",
			applied, firstDumpDiff(log.refs[len(log.msgs)], got))
	}
	return applied, nil
}

// firstDumpDiff names the first line where two dumps differ.
func firstDumpDiff(want, got []byte) string {
	w, g := strings.Split(string(want), "\n"), strings.Split(string(got), "\n")
	for i := range max(len(w), len(g)) {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return fmt.Sprintf("line %d: want %.200s, got %.200s", i+1, wl, gl)
		}
	}
	return "equal"
}

// opPoint counts a phase's file-system operations and calls fn at each, before the
// operation happens, with its index (from 1).
type opPoint struct {
	n  atomic.Int64
	fn func(i int64, op errorfs.Op) error
}

func (o *opPoint) String() string { return "crash points" }

func (o *opPoint) MaybeError(op errorfs.Op) error { return o.fn(o.n.Add(1), op) }

var opKindNames = map[errorfs.OpKind]string{
	errorfs.OpCreate: "create", errorfs.OpLink: "link", errorfs.OpOpen: "open", errorfs.OpOpenDir: "open dir",
	errorfs.OpRemove: "remove", errorfs.OpRemoveAll: "remove all", errorfs.OpRename: "rename",
	errorfs.OpReuseForWrite: "reuse for write", errorfs.OpMkdirAll: "mkdir", errorfs.OpLock: "lock",
	errorfs.OpList: "list", errorfs.OpFilePreallocate: "preallocate", errorfs.OpStat: "stat",
	errorfs.OpGetDiskUsage: "disk usage", errorfs.OpFileClose: "close", errorfs.OpFileRead: "read",
	errorfs.OpFileReadAt: "read at", errorfs.OpFileWrite: "write", errorfs.OpFileWriteAt: "write at",
	errorfs.OpFileStat: "stat file", errorfs.OpFileSync: "sync", errorfs.OpFileSyncData: "sync data",
	errorfs.OpFileSyncTo: "sync to", errorfs.OpFileFlush: "flush",
}

func opString(op errorfs.Op) string {
	name, ok := opKindNames[op.Kind]
	if !ok {
		name = fmt.Sprintf("op %d", op.Kind)
	}
	return name + " " + op.Path
}

// fsDigest identifies a file system's names and contents, so that a crash state met
// twice is checked once.
func fsDigest(fs vfs.FS) string {
	h := sha256.New()
	var walk func(dir string)
	walk = func(dir string) {
		names, _ := fs.List(dir)
		slices.Sort(names)
		for _, name := range names {
			path := fs.PathJoin(dir, name)
			fi, err := fs.Stat(path)
			if err != nil {
				continue
			}
			fmt.Fprintf(h, "%s %v %d\n", path, fi.IsDir(), fi.Size())
			if fi.IsDir() {
				walk(path)
				continue
			}
			f, err := fs.Open(path)
			if err != nil {
				continue
			}
			var buf bytes.Buffer
			_, _ = buf.ReadFrom(f)
			f.Close()
			h.Write(buf.Bytes())
		}
	}
	walk("")
	return string(h.Sum(nil))
}

// tornWALs are the file systems a power loss may leave that kept part of what was
// written to a WAL since its last sync: synced, with one WAL file cut at the end of each
// record (each batch) written since, and once inside a record (a torn one). A batch is
// Pebble's unit of atomicity, so every prefix of batches is a state a crash may leave.
// (CrashClone's own partial mode keeps unsynced blocks and directory entries
// independently, a marker without the manifest it names: an order no real file system
// shows, and Pebble does not claim to survive.)
func tornWALs(synced, all *vfs.MemFS, rng *rand.Rand) []*vfs.MemFS {
	var out []*vfs.MemFS
	for _, path := range filesNamed(all, "", ".log") {
		have, want := readAll(synced, path), readAll(all, path)
		if have == nil || len(want) <= len(have) {
			continue
		}
		num, err := strconv.ParseUint(strings.TrimSuffix(vfs.Default.PathBase(path), ".log"), 10, 64)
		if err != nil {
			continue
		}
		var cuts []int
		for _, end := range walRecordEnds(want, num) {
			if end > len(have) && end < len(want) {
				cuts = append(cuts, end)
			}
		}
		cuts = append(cuts, len(have)+rng.IntN(len(want)-len(have)))
		for _, cut := range cuts {
			torn := synced.CrashClone(vfs.CrashCloneCfg{})
			f, err := torn.Create(path, vfs.WriteCategoryUnspecified)
			if err != nil {
				continue
			}
			_, _ = f.Write(want[:cut])
			_ = f.Sync()
			f.Close()
			out = append(out, torn)
		}
	}
	return out
}

// walRecordEnds are the offsets at which the records of a WAL (numbered num) end.
func walRecordEnds(data []byte, num uint64) []int {
	r := newRecordReader(record.NewReader, bytes.NewReader(data), num)
	var ends []int
	for {
		rec, err := r.Next()
		if err != nil {
			return ends
		}
		if _, err := io.Copy(io.Discard, rec); err != nil {
			return ends
		}
		ends = append(ends, int(r.Offset()))
	}
}

// newRecordReader calls record.NewReader with a log number of Pebble's internal type,
// which a test outside Pebble cannot name.
func newRecordReader[N ~uint64](newReader func(io.Reader, N) *record.Reader, r io.Reader, num uint64) *record.Reader {
	return newReader(r, N(num))
}

// filesNamed lists the files under dir whose names end with suffix.
func filesNamed(fs vfs.FS, dir, suffix string) []string {
	var out []string
	names, _ := fs.List(dir)
	slices.Sort(names)
	for _, name := range names {
		path := fs.PathJoin(dir, name)
		fi, err := fs.Stat(path)
		switch {
		case err != nil:
		case fi.IsDir():
			out = append(out, filesNamed(fs, path, suffix)...)
		case strings.HasSuffix(name, suffix):
			out = append(out, path)
		}
	}
	return out
}

// readAll is a file's contents, or nil if it cannot be read.
func readAll(fs vfs.FS, path string) []byte {
	f, err := fs.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(f); err != nil {
		return nil
	}
	return b.Bytes()
}

// crashState is a file system a crash left, and where the crash came.
type crashState struct {
	fs    *vfs.MemFS
	where string
}

// base makes the file system a phase starts from, prepared, on a crashable MemFS.
func (p *crashPhase) base(t *testing.T) *vfs.MemFS {
	t.Helper()
	fs := vfs.NewCrashableMem()
	if p.prepare != nil {
		if err := p.prepare(fs); err != nil {
			t.Fatalf("%s: prepare: %v", p.name, err)
		}
	}
	return fs
}

// fresh is a copy of base for one run (base's store is closed: all of it synced).
func fresh(base *vfs.MemFS) *vfs.MemFS { return base.CrashClone(vfs.CrashCloneCfg{}) }

// crashAll makes the crash tests walk every crash state and every fault index of each
// phase. CI runs them so, without -race, as a step of their own (.ci/run; ~12 s on two
// cores, docs/testing.md).
var crashAll = flag.Bool("crash.all", false, "walk every crash state and fault index of each phase (TestCrashAtEveryOperation, TestFaultAtEveryOperation)")

// crashChecks and faultRuns bound the walks: none with -crash.all; otherwise an evenly
// spread sample, smaller under the race detector (which makes each reopening and replay
// ten times slower), so that the package's tests stay short and within CI's time on two
// cores. Every crash point's state is still taken and told apart; only the reopenings
// are sampled.
func crashChecks() int {
	switch {
	case *crashAll:
		return 0
	case raceEnabled:
		return 24
	}
	return 40
}

func faultRuns() int {
	switch {
	case *crashAll:
		return 0
	case raceEnabled:
		return 12
	}
	return 40
}

// spread keeps at most n of items, evenly spread, first and last included; n 0 keeps
// all.
func spread[T any](items []T, n int) []T {
	if n <= 0 || len(items) <= n {
		return items
	}
	out := make([]T, 0, n)
	for i := range n {
		out = append(out, items[i*(len(items)-1)/(n-1)])
	}
	return out
}

// Property: a power loss at any file-system operation of a phase (or between two
// messages) leaves a state that opens, equals the replay of the log up to the sequence
// it says it applied, and reaches the uncrashed state with the rest of the log.
func TestCrashAtEveryOperation(t *testing.T) {
	log := getCrashLog(t)
	for _, p := range crashPhases(t, log) {
		t.Run(p.name, func(t *testing.T) {
			began := time.Now()
			fs := fresh(p.base(t))
			var (
				mu     sync.Mutex
				states []crashState
				seen   = map[string]bool{}
				stage  atomic.Value
			)
			stage.Store("starting")
			rng := rand.New(rand.NewPCG(30, 30))
			crash := func(where string) {
				mu.Lock()
				defer mu.Unlock()
				synced := fs.CrashClone(vfs.CrashCloneCfg{})
				all := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 100, RNG: rng})
				candidates := []crashState{
					{synced, where + ": only what was synced survives (a power loss)"},
					{all, where + ": all that was written survives (a process death)"},
				}
				for _, torn := range tornWALs(synced, all, rng) {
					candidates = append(candidates, crashState{torn, where + ": what was synced and part of the WAL written since (a power loss tearing the WAL)"})
				}
				for _, st := range candidates {
					if d := fsDigest(st.fs); !seen[d] {
						seen[d] = true
						states = append(states, st)
					}
				}
			}
			points := &opPoint{fn: func(i int64, op errorfs.Op) error {
				crash(fmt.Sprintf("crash before operation %d (%s, %s)", i, opString(op), stage.Load()))
				return nil
			}}
			at := func(s string) {
				stage.Store(s)
				crash("crash " + s)
			}
			if err := p.run(errorfs.Wrap(fs, points), at); err != nil {
				t.Fatalf("the phase without a crash: %v", err)
			}
			crash("crash after the phase")
			ops := points.n.Load()
			checked := spread(states, crashChecks())
			lowest, highest := uint64(1<<63), uint64(0)
			for _, st := range checked {
				applied, err := p.check(log, st.fs)
				if err != nil {
					t.Fatalf("%s: %v", st.where, err)
				}
				lowest, highest = min(lowest, applied), max(highest, applied)
			}
			t.Logf("%d operations, %d distinct crash states, %d checked (reopened at applied %d to %d) in %v",
				ops, len(states), len(checked), lowest, highest, time.Since(began).Round(time.Millisecond))
		})
	}
}

// Property: an error injected at operation i of a phase, for i = 1, 2, ... until the
// phase runs untouched, either surfaces (the store's call fails or Pebble panics: the
// process dies) or is absorbed; either way the store reopened from what it left, as it
// was (a process death keeps the page cache) and after a power loss, equals the replay
// of the log up to the sequence it says it applied, and reaches the uncrashed state
// with the rest of the log.
func TestFaultAtEveryOperation(t *testing.T) {
	log := getCrashLog(t)
	for _, p := range crashPhases(t, log) {
		t.Run(p.name, func(t *testing.T) {
			began := time.Now()
			base := p.base(t)
			surfaced, absorbed, checks := 0, 0, 0
			var indices []int64
			{ // the phase untouched, to count its operations
				var stage atomic.Value
				points := &faultPoint{stage: &stage}
				if err := p.run(errorfs.Wrap(fresh(base), points), func(string) {}); err != nil {
					t.Fatalf("the phase without a fault: %v", err)
				}
				for i := range points.n.Load() + 1 {
					indices = append(indices, i+1)
				}
			}
			indices = spread(indices, faultRuns())
			untouched := 0
			for k := 0; k < len(indices); k++ {
				fs := fresh(base)
				var stage atomic.Value
				stage.Store("starting")
				points := &faultPoint{i: indices[k], stage: &stage}
				err := runRecovered(func() error {
					return p.run(errorfs.Wrap(fs, points), func(s string) { stage.Store(s) })
				})
				where := points.hit.Load()
				switch {
				case where == nil:
					// The phase ran untouched: past its last operation (the walk is done),
					// or Pebble's background work (the WAL's flusher, deletions of obsolete
					// files) made it do fewer this time.
					untouched++
					continue
				case k == len(indices)-1:
					indices = append(indices, indices[k]+1) // not done: the phase did more this time
				}
				if err != nil {
					surfaced++
				} else {
					absorbed++
				}
				lost := fs.CrashClone(vfs.CrashCloneCfg{})
				for _, v := range []struct {
					fs   vfs.FS
					name string
				}{{fs, "the process died"}, {lost, "then the power failed"}} {
					checks++
					if _, cerr := p.check(log, v.fs); cerr != nil {
						t.Fatalf("%s (the phase returned %v), %s: %v", *where, err, v.name, cerr)
					}
				}
			}
			t.Logf("%d operation indices walked (up to %d), errors surfaced at %d and absorbed at %d (%d runs untouched), %d reopenings checked, in %v",
				len(indices), indices[len(indices)-1], surfaced, absorbed, untouched, checks, time.Since(began).Round(time.Millisecond))
		})
	}
}

// injectable reports whether TestFaultAtEveryOperation injects an error into op (the
// walk counts these operations only). Not into an fsync, nor into what changes the WAL,
// the MANIFEST or the markers that name the current MANIFEST: Pebble treats their
// failure as fatal (an fsync cannot be retried; a lost WAL or MANIFEST write is a lost
// commit) and panics, at times in its own goroutines or with a lock released, which
// kills the whole test binary; in production that is the process dying at that
// operation, which TestCrashAtEveryOperation's process-death state at each operation
// is. Nor into the listing of the directory or the OPTIONS file that Pebble's Open
// writes after its WAL replay: an Open that fails there (Pebble v2.1.7) leaves its
// table-stats goroutine reading through the closed file cache, which panics (integer
// divide by zero) in that goroutine. Their reads are injected.
func injectable(op errorfs.Op) bool {
	switch op.Kind {
	case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
		return false
	case errorfs.OpList:
		return false
	case errorfs.OpOpen, errorfs.OpFileRead, errorfs.OpFileReadAt, errorfs.OpFileStat, errorfs.OpStat, errorfs.OpOpenDir:
		return true
	}
	base := vfs.Default.PathBase(op.Path)
	for _, fatal := range []string{".log", "MANIFEST-", "marker.", "OPTIONS-", ".dbtmp"} {
		if strings.HasPrefix(base, fatal) || strings.HasSuffix(base, fatal) {
			return false
		}
	}
	return true
}

// faultPoint counts a phase's injectable operations and injects an error at the i-th.
type faultPoint struct {
	i     int64
	n     atomic.Int64
	stage *atomic.Value
	hit   atomic.Pointer[string]
}

func (f *faultPoint) String() string { return fmt.Sprintf("an error at injectable operation %d", f.i) }

func (f *faultPoint) MaybeError(op errorfs.Op) error {
	if !injectable(op) || f.n.Add(1) != f.i {
		return nil
	}
	where := fmt.Sprintf("an error injected at injectable operation %d (%s, %s)", f.i, opString(op), f.stage.Load())
	f.hit.Store(&where)
	return errorfs.ErrInjected
}

// runRecovered runs fn; a panic (Pebble's fatal errors panic through the store's
// logger) is its error.
func runRecovered(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return fn()
}
