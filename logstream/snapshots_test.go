package logstream

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/flowrun/flow/checkpoint"
)

// The object store sends one message per Read of the snapshot; a snapshot must go up in
// full chunks, not in the 16 KiB pieces its writer produces (the soak's 70 MiB state
// became 4,500 messages and the upload stalled: docs/perf.md).
func TestSnapshotIsUploadedInFullChunks(t *testing.T) {
	env := startEnv(t, t.TempDir())
	ctx := ctxT(t)
	inputs, err := json.Marshal(map[string]string{"pad": strings.Repeat("x", 8<<10)})
	if err != nil {
		t.Fatal(err)
	}
	var entries []checkpoint.Entry
	for i := range 100 { // ~800 KiB of state: several 128 KiB chunks
		entry := submitEntry(fmt.Sprintf("r%03d", i), checkpoint.StepSpec{Name: "one"})
		entry.Submit.Inputs = inputs
		entries = append(entries, entry)
	}
	for i := 0; i < len(entries); i += 10 {
		if err := env.log.Writer.Write(ctx, entries[i:i+10]...).Await(ctx); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := env.log.Snapshots.Take(ctx)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := env.js.ObjectStore(ctx, SnapshotBucket)
	if err != nil {
		t.Fatal(err)
	}
	info, err := obs.GetInfo(ctx, snap.Name)
	if err != nil {
		t.Fatal(err)
	}
	chunk := uint64(info.Opts.ChunkSize)
	if chunk == 0 {
		chunk = 128 << 10 // the object store's default
	}
	want := (info.Size + chunk - 1) / chunk
	if info.Size < 4*chunk || uint64(info.Chunks) != want {
		t.Fatalf("snapshot of %d bytes went up in %d chunks, want %d of %d bytes", info.Size, info.Chunks, want, chunk)
	}
	// And it restores: the chunks are the snapshot.
	r, err := obs.Get(ctx, snap.Name)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	meta, err := checkpoint.RestoreSnapshot(t.TempDir()+"/restored", r, nil)
	if err != nil {
		t.Fatal(err)
	}
	if meta.Seq != snap.Seq {
		t.Fatalf("restored sequence %d, want %d", meta.Seq, snap.Seq)
	}
}
