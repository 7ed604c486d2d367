package logstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/checkpoint/checkpointtest"
	"github.com/flowrun/flow/internal/base/testhooks"
)

// fuzzSeeded is how many messages of the random log (seed 2) the fuzzer's stores hold
// before its input; the log's later messages seed the corpus.
const (
	fuzzLogSeed = 2
	fuzzLogSize = 56
	fuzzSeeded  = 28
)

var fuzzBase struct {
	once sync.Once
	fs   *vfs.MemFS // a closed store, "state", that applied the seeded messages
	err  error
}

// fuzzStore opens a copy of the seeded store.
func fuzzStore(t *testing.T) *checkpoint.Store {
	t.Helper()
	fuzzBase.once.Do(func() {
		fs := vfs.NewCrashableMem()
		s, err := checkpoint.OpenStore("state", checkpoint.StoreOptions{FS: fs})
		if err != nil {
			fuzzBase.err = err
			return
		}
		for i, m := range checkpointtest.RandomLog(fuzzLogSeed, fuzzLogSize)[:fuzzSeeded] {
			if _, err := s.Apply(uint64(i+1), m); err != nil {
				fuzzBase.err = err
			}
		}
		if err := s.Close(); err != nil && fuzzBase.err == nil {
			fuzzBase.err = err
		}
		// Opened once more: Pebble flushes the WAL it replays, so that opening a copy
		// replays nothing (a fifth of the time of one).
		if s, err = checkpoint.OpenStore("state", checkpoint.StoreOptions{FS: fs}); err == nil {
			err = s.Close()
		}
		if err != nil && fuzzBase.err == nil {
			fuzzBase.err = err
		}
		fuzzBase.fs = fs
	})
	if fuzzBase.err != nil {
		t.Fatal(fuzzBase.err)
	}
	s, err := checkpoint.OpenStore("state", checkpoint.StoreOptions{FS: fuzzBase.fs.CrashClone(vfs.CrashCloneCfg{})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// FuzzOwnMessage is the path a node's own message takes, fed arbitrary bytes as two
// messages: the writer hands the bytes to its decoder goroutine while the publish is in
// flight (Writer.predecode; with mode's bit i clear, message i finds the decoder busy
// and is decoded by the apply), then applies them from memory when the ack comes
// (Writer.applyOwn, Applier.applyOwn, Store.ApplyIfNext) and resolves the message's
// Future. Another node applies the same bytes from the consumer (Store.Apply). Never a
// panic; the writer's Future gets exactly the verdicts the other node's apply gives, at
// the message's sequence; a message the other node refuses to apply (a newer format)
// stops this node's applier with the same error and applies nothing; the two states
// dump the same bytes.
func FuzzOwnMessage(f *testing.F) {
	msgs := checkpointtest.RandomLog(fuzzLogSeed, fuzzLogSize)
	for i := fuzzSeeded; i+1 < len(msgs); i += 2 {
		f.Add(msgs[i], msgs[i+1], uint8(i))
	}
	f.Add([]byte("not json"), msgs[fuzzSeeded], uint8(3))
	f.Add(msgs[fuzzSeeded], []byte(`{"v":1,"node":"x","entries":[]}`), uint8(1))
	f.Add([]byte(`{"v":3,"node":"x","entries":[{"k":"cancel","run":"run-1","at":"2026-11-29T02:00:00Z"}]}`), msgs[fuzzSeeded], uint8(3))
	f.Add([]byte(`{"v":1,"node":"x","entries":[{"k":"retire","run":"run-1","term":1,"at":"2026-11-29T02:00:00Z"}]}`), msgs[fuzzSeeded], uint8(2))
	f.Fuzz(func(t *testing.T, first, second []byte, mode uint8) {
		own, other := fuzzStore(t), fuzzStore(t)
		cfg := DefaultConfig()
		cfg.Store, cfg.Node = own, "fuzz"
		log := slog.New(slog.DiscardHandler)
		hooks := testhooks.OrProduction(nil)
		a := newApplier(cfg, hooks, log)
		w := newWriter(cfg, a, DefaultMaxOutputBytes, 8<<20, hooks, log)
		ctx, cancel := context.WithCancel(context.Background())
		w.wg.Add(1)
		go w.runDecoder(ctx) // the writer's decoder alone: no NATS
		defer func() { cancel(); w.wg.Wait() }()
		for i, m := range [][]byte{first, second} {
			seq := other.Applied() + 1
			want, wantErr := other.Apply(seq, m)
			var job *decodeJob
			for mode&(1<<i) != 0 && job == nil {
				if job = w.predecode(m); job == nil {
					runtime.Gosched() // the decoder is finishing the previous job
				}
			}
			id := fmt.Sprintf("fuzz-%d", i)
			fut := newFuture(a, len(want))
			a.expect(id, []*Future{fut})
			w.applyOwn(id, seq, m, job)
			if wantErr != nil {
				if !errors.Is(wantErr, checkpoint.ErrNewerFormat) {
					t.Fatalf("message %q at %d: the consumer's apply stops with %v; only a newer format may", m, seq, wantErr)
				}
				if err := a.Err(); !errors.Is(err, checkpoint.ErrNewerFormat) || own.Applied() != seq-1 {
					t.Fatalf("message %q at %d of a newer format: this node's applier has %v, applied %d; want ErrNewerFormat and nothing applied", m, seq, err, own.Applied())
				}
				break
			}
			if err := a.Err(); err != nil {
				t.Fatalf("message %q at %d: this node's applier stopped with %v; the other node applied it (%v)", m, seq, err, want)
			}
			got := fut.Results(ctx)
			if fut.Seq() != seq || own.Applied() != seq || fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("message %q at %d: the writer's Future has %v at %d (applied %d); the other node's apply gives %v", m, seq, got, fut.Seq(), own.Applied(), want)
			}
		}
		var do, dt bytes.Buffer
		if err := own.Dump(&do); err != nil {
			t.Fatal(err)
		}
		if err := other.Dump(&dt); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(do.Bytes(), dt.Bytes()) {
			t.Fatalf("after %q and %q: this node's state differs from the other's", first, second)
		}
	})
}
